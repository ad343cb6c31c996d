"""Wall time of every stage of a finished run, from Snakemake's per-job benchmark files.

    python benchmarks/pipeline_wall_time.py [WORKDIR] [--budget-min 20] [--out PREFIX]

Reads WORKDIR/results/benchmarks/**/*.tsv (one per job), prints each stage's seconds, the
sum, and the ratio of the run's wall time (first job start to last job end, from the files'
modification times) to the budget.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from record_run import header, header_line, stage_times, this_command, write_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", nargs="?", default=".")
    parser.add_argument("--budget-min", type=float, default=20.0)
    parser.add_argument("--out", help="write PREFIX.md and PREFIX.json")
    args = parser.parse_args()
    times = stage_times(Path(args.workdir))
    if times.empty:
        raise SystemExit(f"no benchmark files under {args.workdir}/results/benchmarks")
    wall = times["end"].max() - times["start"].min()
    lines = ["| job | seconds | max RSS (MB) |", "|---|---|---|"]
    for row in times.sort_values("start").itertuples():
        lines.append(f"| {row.job} | {row.seconds:.0f} | {row.max_rss_mb:.0f} |")
    summary = (
        f"\nsum of job times: {times['seconds'].sum():.0f} s; run wall time: {wall:.0f} s "
        f"= {wall / 60:.1f} min; budget {args.budget_min:.0f} min; ratio {wall / 60 / args.budget_min:.2f}"
    )
    print("\n".join(lines) + summary)
    if args.out:
        record = {**header(this_command("python")), "jobs": times.drop(columns=["start", "end"]).to_dict("records"),
                  "wall_s": wall, "budget_min": args.budget_min}
        write_record(args.out, record, "\n".join(lines) + summary + "\n\n" + header_line(record))


if __name__ == "__main__":
    main()
