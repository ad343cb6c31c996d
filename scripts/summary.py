"""Write results/summary.md and results/summary.json (see draftline.stages.summary)."""

from dataclasses import asdict
from pathlib import Path

from draftline.runtime.logs import log_to
from draftline.stages.summary import build_summary, write_summary

if __name__ == "__main__":
    log_to(snakemake.log[0])
    summary = build_summary(
        Path(snakemake.output.json).parent,  # results/
        # run_name (default: the work folder's name), target, device, benchmarks: SummarySettings, a
        # param Snakemake does not compare, so a moved or renamed run reruns nothing
        **asdict(snakemake.params.settings),
    )
    write_summary(summary, snakemake.output.markdown, snakemake.output.json)
