"""A record of one session's runs on the GPU test host (benchmarks/cuda/h200_pipeline.sh), finished or cut short.

    python benchmarks/cuda/h200_session_record.py UNPACKED --out benchmarks/cuda/results/NAME \
        --commit COMMIT --date YYYY-MM-DD --note TEXT [--cpu-record benchmarks/results/default_acceptance.json]

UNPACKED holds each run's tarball as `wait` brought it back, unpacked into a folder named after
the run (`mkdir -p U/default && tar xzf FILES/default.tar.gz -C U/default`, the same for
preflight; a tarball over 15 MB comes in parts: `cat FILES/default.tar.gz.* | tar xzf - -C U/default`),
and `wait`'s gpu.csv beside them. For each run: its status lines (start, end, rc), each job's GPU wait and GPU time
(from `draftline.runtime.devices`' lines in the job logs: all runs share one GPU lock folder,
so a job's benchmark time includes its wait), each job's Snakemake benchmark seconds, what
ran and what did not (the DAG's jobs planned against those with a benchmark file); preflight's
report (ok, each check, the measured figures); every acceptance file the default run wrote
(results/eval/*.json, results/eval/sets/*.json), each set's figure and interval, how its
per-prompt counts were made, and each one paired by prompt with the CPU record's same set and
draft (`draftline.artifacts.acceptance.paired_difference`). Writes NAME.json and NAME.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from draftline.artifacts.acceptance import paired_difference, read  # noqa: E402
from draftline.artifacts.checkpoint import tokens_per_step_estimate, validation_per_position  # noqa: E402

SLOT = re.compile(r"^(\S+ \S+),\d+ draftline\.runtime\.devices local GPU slot")
WAIT = re.compile(r"^(\S+ \S+),\d+ draftline\.runtime\.devices waiting for")
STAMP = re.compile(r"^(2\d{3}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ ")


def gpu_jobs(repo: Path) -> list[dict]:
    """Each job log that claimed the GPU: when it started waiting, got the slot, last logged."""
    jobs = []
    for log in sorted((repo / "logs").rglob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        slot = next((m[1] for line in lines if (m := SLOT.match(line))), None)
        if slot is None:
            continue
        wait = next((m[1] for line in lines if (m := WAIT.match(line))), None)
        last = [m[1] for line in lines if (m := STAMP.match(line))][-1]
        jobs.append({"job": str(log.relative_to(repo / "logs").with_suffix("")), "waited_from": wait, "gpu_from": slot,
                     "last_log_line": last})
    return sorted(jobs, key=lambda j: j["gpu_from"])


# what each stage measured of itself, in its job's log: engine starts, rates, fidelity, training
STAGE_LINE = re.compile(r"^\S+ (\d\d:\d\d:\d\d),\d+ (draftline(?:\.\S+)?) (.*(?:loaded in [\d.]+ s|engine ready in|"
                        r"tok/s|tokens/s|ms per output token|top-1 agreement|answers truncated|trainer finished in|chose epoch|"
                        r"epoch \d+ done|step failed).*)")


def stage_lines(repo: Path) -> dict:
    """Each job log's own figures (STAGE_LINE), in the order the jobs logged them."""
    out = {}
    for log in sorted((repo / "logs").rglob("*.log")):
        found = [f"{m[1]} {m[3][:600]}" for line in log.read_text(errors="replace").splitlines()
                 if (m := STAGE_LINE.match(line))]
        if found:
            out[str(log.relative_to(repo / "logs").with_suffix(""))] = found
    return out


def benchmark_seconds(repo: Path) -> dict:
    folder = repo / "results" / "benchmarks"
    out = {}
    for tsv in sorted(folder.rglob("*.tsv")):
        rows = tsv.read_text().splitlines()
        if len(rows) >= 2:
            out[str(tsv.relative_to(folder).with_suffix(""))] = round(float(rows[-1].split("\t")[0]), 1)
    return out


def acceptance_files(repo: Path, cpu_record: Path | None) -> dict:
    out = {}
    cpu = read(cpu_record) if cpu_record else None
    for path in sorted((repo / "results" / "eval").rglob("*.json")):
        if path.name.endswith("provenance.json"):
            continue
        data = json.loads(path.read_text())
        for set_name, block in (data.get("sets") or {}).items():
            for draft, d in (block.get("drafts") or {}).items():
                entry = {
                    "file": str(path.relative_to(repo)), "prompts": block.get("prompts"),
                    "mean_acceptance_length": round(d["mean_acceptance_length"], 4),
                    "bootstrap_95": (d.get("spread") or {}).get("bootstrap_95"),
                    "acceptance_per_position": [round(x, 4) for x in d["acceptance_per_position"]],
                    "per_prompt_counts": d.get("per_prompt_counts") or ("vllm" if d.get("per_prompt") else None),
                    "lossless": data.get("lossless"),
                }
                theirs = (((cpu or {}).get("sets") or {}).get(set_name) or {}).get("drafts", {}).get(draft)
                if theirs and theirs.get("per_prompt") and d.get("per_prompt"):
                    entry["minus_cpu_record"] = paired_difference(d["per_prompt"], theirs["per_prompt"],
                                                                  names=("CUDA bf16", "CPU record"))
                out[f"{set_name}/{draft}"] = entry
    return out


def steps_done(log: str) -> list[str]:
    """Each Snakemake call's last "N of M steps done" (a run may be several calls, one after the
    other: the default run's are two); a call starts where the count goes back or M changes."""
    calls: list[tuple[int, int]] = []
    for n, m in re.findall(r"(\d+) of (\d+) steps \(\d+%\) done", log):
        n, m = int(n), int(m)
        if calls and m == calls[-1][1] and n > calls[-1][0]:
            calls[-1] = (n, m)
        else:
            calls.append((n, m))
    return [f"{n} of {m}" for n, m in calls]


def provenance(repo: Path) -> dict:
    """The package versions and workflow commits the run's jobs wrote into their provenance files
    (draftline.lineage.provenance), each distinct value once: what ran, not what was meant to."""
    versions: dict[str, set] = {}
    commits = set()
    for path in sorted((repo / "results").rglob("provenance.json")):
        data = json.loads(path.read_text())
        for name, version in (data.get("versions") or {}).items():
            versions.setdefault(name, set()).add(str(version))
        workflow = data.get("workflow") or {}
        if workflow.get("commit"):
            commits.add(workflow["commit"][:7] + (" with uncommitted changes" if workflow.get("dirty") else ""))
    return {"versions": {k: sorted(v) for k, v in sorted(versions.items())}, "workflow_commits": sorted(commits)}


def run_facts(folder: Path, cpu_record: Path | None) -> dict:
    repo = folder / "repo"
    status = (folder / "status").read_text().splitlines() if (folder / "status").is_file() else []
    log = (folder / "run.log").read_text(errors="replace") if (folder / "run.log").is_file() else ""
    facts = {
        "status": status,
        "steps_done": steps_done(log),
        "jobs_finished": sorted(set(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", log))),
        "benchmark_seconds": benchmark_seconds(repo),
        "gpu_jobs": gpu_jobs(repo),
        "stage_lines": stage_lines(repo),
        "acceptance": acceptance_files(repo, cpu_record),
        "draft_validation": validation_per_position(repo / "results" / "checkpoint" / "final"),
        **provenance(repo),
    }
    report = repo / "results" / "preflight" / "report.json"
    if report.is_file():
        data = json.loads(report.read_text())
        facts["preflight"] = {"ok": data["ok"], "failed": data["failed"], "measured": data["measured"],
                              "checks": data["checks"]}
    return facts


def gpu_named(csv: Path) -> str:
    """`wait`'s nvidia-smi listing (name, memory.used, memory.total, utilization.gpu): the GPUs by name."""
    if not csv.is_file():
        raise SystemExit(f"{csv}: no GPU listing from the host (pass --machine)")
    names = [line.split(",")[0].strip() for line in csv.read_text().splitlines()[1:] if line.strip()]
    return f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)


def interval(ci) -> str:
    return f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "none"


def markdown(record: dict) -> str:
    lines = [f"# {record['title']}", "", f"**{record['lead']}**", ""]
    for run, facts in record["runs"].items():
        status = "; ".join(f"`{x.strip()}`" for x in facts["status"]) or "no status"
        steps = ", then ".join(facts["steps_done"]) or "none"
        lines += [f"## {run}", "", f"Status: {status}; steps done (each Snakemake call): {steps}; jobs finished: "
                  f"{', '.join(facts['jobs_finished']) or 'none'}.", ""]
        if facts.get("preflight"):
            p = facts["preflight"]
            lines += [f"Preflight: {'all checks passed' if p['ok'] else 'failed: ' + ', '.join(map(str, p['failed']))}.", "",
                      "| part | check | result | reason |", "|---|---|---|---|"]
            lines += [f"| {c['part']} | {c['name']} | {c['status']} | {c['reason']} |" for c in p["checks"]]
            lines += ["", "| measured | value |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in p["measured"].items()] + [""]
        if facts["acceptance"]:
            lines += ["| set / draft | prompts | mean acceptance length | 95% bootstrap | per-prompt counts "
                      "| minus the CPU record, paired [95%] |",
                      "|---|---|---|---|---|---|"]
            for key, a in facts["acceptance"].items():
                counts = a["per_prompt_counts"]
                counts = counts if isinstance(counts, str) else (
                    f"{counts['source']} (same as batched: {counts['same_counts_as_batched']}; "
                    f"outputs unlike batched: {counts['outputs_unlike_batched']})" if counts else "none")
                paired = a.get("minus_cpu_record")
                paired = f"{paired['mean_acceptance_length']:+.4f} {interval(paired['bootstrap_95'])}" if paired else "not paired"
                lines.append(f"| {key} | {a['prompts']} | {a['mean_acceptance_length']:.4f} | {interval(a['bootstrap_95'])} | "
                             f"{counts} | {paired} |")
            lines.append("")
        if facts.get("draft_validation"):
            rows = facts["draft_validation"]
            lines += ["The published draft's validation metrics (speculators' Trainer, results/checkpoint/final/val_metrics.json; "
                      "on the held-out training rows as training unrolls the draft, not vLLM's acceptance):", "",
                      "| draft position | loss | full accuracy (drafts up to it all right) | conditional accuracy |",
                      "|---|---|---|---|"]
            lines += [f"| {r['position'] + 1} | {r['loss']:.4f} | {r['full_acc']:.4f} | {r['cond_acc']:.4f} |" for r in rows]
            lines += ["", f"1 + the sum of the full accuracies: {tokens_per_step_estimate(rows):.3f} tokens a step, "
                      "what a greedy verifier would accept if vLLM drafted as training does "
                      "(an estimate, not a measurement of acceptance).", ""]
        if facts.get("versions"):
            lines += ["Versions (the jobs' provenance files): " + ", ".join(f"{k} {'/'.join(v)}" for k, v in facts["versions"].items())
                      + "; workflow commit as the jobs saw it: " + (", ".join(facts["workflow_commits"]) or "none") + ".", ""]
        lines += ["| job (GPU, in turn) | waited from | GPU from | last draftline log line |", "|---|---|---|---|"]
        lines += [f"| {j['job']} | {j['waited_from'] or '-'} | {j['gpu_from']} | {j['last_log_line']} |" for j in facts["gpu_jobs"]]
        lines += ["", "Job seconds (Snakemake's benchmark files; a GPU job's include its wait for the GPU): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in facts["benchmark_seconds"].items()), ""]
        if facts.get("stage_lines"):
            lines += ["What each job logged of its own work (UTC; its log under logs/):", ""]
            for job, found in facts["stage_lines"].items():
                lines += [f"- `{job}`:"] + [f"  - `{x}`" for x in found]
            lines.append("")
    versions = f"; {record['versions']}" if record.get("versions") else ""
    lines += [f"Commit {record['commit']}; {record['machine']}{versions}; {record['date']}. "
              f"Command: `{record['command']}`.", ""]
    if record.get("note"):
        lines += [record["note"], ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("unpacked", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--date", required=True)
    parser.add_argument("--title", required=True)
    parser.add_argument("--lead", required=True, help="the record's one bold line")
    parser.add_argument("--command", required=True)
    parser.add_argument("--machine", help="the machine in words; by default the GPU that `wait` listed (UNPACKED/gpu.csv)")
    parser.add_argument("--versions", help="only for runs whose jobs wrote no provenance (each run's are read from it)")
    parser.add_argument("--cpu-record", type=Path)
    parser.add_argument("--note")
    args = parser.parse_args()
    machine = args.machine or gpu_named(args.unpacked / "gpu.csv")
    runs = {folder.name: run_facts(folder, args.cpu_record) for folder in sorted(args.unpacked.iterdir()) if (folder / "repo").is_dir()}
    record = {"title": args.title, "lead": args.lead, "command": args.command, "commit": args.commit, "date": args.date,
              "machine": machine, "versions": args.versions, "cpu_record": str(args.cpu_record) if args.cpu_record else None,
              "note": args.note, "runs": runs}
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
