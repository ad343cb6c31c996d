"""Snakemake's per-job benchmark files (`benchmark:`, results/benchmarks/**.tsv): wall seconds per job."""

from __future__ import annotations

import csv
from pathlib import Path


def read_benchmarks(benchmark_dir: str | Path, exclude: tuple[str, ...] = ("report",)) -> dict[str, float]:
    """Job name (path under benchmark_dir without .tsv) -> wall seconds of its last run."""
    root = Path(benchmark_dir)
    times = {}
    for path in sorted(root.rglob("*.tsv")):
        name = path.relative_to(root).with_suffix("").as_posix()
        if name.split("/")[0] in exclude:
            continue
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if rows and rows[-1].get("s") not in (None, "", "NA"):
            times[name] = float(rows[-1]["s"])
    return times
