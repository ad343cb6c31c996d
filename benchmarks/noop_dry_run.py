"""How long "Nothing to be done" takes: a dry run of a finished run with many hidden-state shards.

The finished run is faked (placeholder outputs, then `snakemake --touch` records Snakemake's
metadata in job order), so no job runs; the rerun decision reads only that metadata, the
files' mtimes and checksums. The target is the tiny model (used in place).

    PYTHONPATH=src:tests .venv/bin/python benchmarks/noop_dry_run.py --shards 64 --repeats 3

Writes benchmarks/results/noop_dry_run.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

from record_run import header, header_line, load_now, this_command, write_record
from workflow import REPO, fake_finished_run, planned_jobs, snakemake, write_config

from draftline.testing.tiny_model import build_tiny_model

TARGET = "results/lineage.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "noop_dry_run"))
    args = parser.parse_args()
    head = header(this_command("PYTHONPATH=src:tests .venv/bin/python"), packages=("snakemake",),
                  commit_paths=("Snakefile", "rules", "src"))

    with tempfile.TemporaryDirectory(prefix="noop-dry-run-") as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "tiny-model")
        workdir = root / "run"
        workdir.mkdir()
        (workdir / "prompts.jsonl").write_text(
            "".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(2 * args.shards + 8))
        )
        write_config(workdir, {
            "target": {"model": str(model)},
            "prompts": {"sources": ["prompts.jsonl"], "validation": 1, "test": 1},
            "tokenize": {"max_seq_len": 256},
            "hidden_states": {"shards": args.shards},
            "vocab": {"draft_vocab_size": 256},
        })
        t0 = time.perf_counter()
        fake_finished_run(workdir, TARGET)
        fake_s = time.perf_counter() - t0

        timings, cpu, messages = [], [], []
        for _ in range(args.repeats):
            r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            out = snakemake(workdir, "-n", TARGET)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            timings.append(time.perf_counter() - t0)
            # CPU seconds: what the dry run costs on an idle core, whatever else runs here
            cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            messages.append("Nothing to be done" in out.stdout + out.stderr)
        jobs = planned_jobs(workdir, TARGET)
        # The same dry run without the parse: Snakemake's own start-up is most of it.
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        snakemake(workdir, "--version")
        version_s = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        version_cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime

    result = {
        **head,
        "shards": args.shards,
        "dry_run_seconds": [round(t, 2) for t in timings],
        "median_seconds": round(statistics.median(timings), 2),
        "dry_run_cpu_seconds": [round(t, 2) for t in cpu],
        "median_cpu_seconds": round(statistics.median(cpu), 2),
        "nothing_to_be_done": all(messages),
        "planned_jobs": jobs,
        "snakemake_version_seconds": round(version_s, 2),
        "snakemake_version_cpu_seconds": round(version_cpu, 2),
        "fake_run_seconds": round(fake_s, 1),
        "load_at_end": load_now(),
    }
    write_record(args.out, result,
        f"# No-op dry run with {args.shards} hidden-state shards\n\n"
        f"`snakemake -n {TARGET}` on a finished run (faked with `--touch`): "
        f"{'Nothing to be done' if all(messages) else 'JOBS PLANNED: ' + str(jobs)}.\n\n"
        f"| run | wall seconds | CPU seconds |\n|---|---|---|\n"
        + "".join(f"| {i + 1} | {t:.2f} | {c:.2f} |\n" for i, (t, c) in enumerate(zip(timings, cpu)))
        + f"\nMedian {result['median_seconds']} s wall, {result['median_cpu_seconds']} CPU s (goal: < 10 s). "
        f"`snakemake --version` alone: {version_s:.2f} s wall, {version_cpu:.2f} CPU s. "
        f"Load averages at the end: {result['load_at_end']}.\n\n"
        + header_line(result)
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
