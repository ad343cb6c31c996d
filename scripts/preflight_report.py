"""Preflight report: the parts' checks in results/preflight/report.json and report.md
(see draftline.artifacts.preflight)."""

from draftline.artifacts.preflight import assemble, write_report
from draftline.runtime.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    parts = {name: snakemake.input[name] for name in ("environment", "regenerate", "hidden_states", "speculative", "training")}
    write_report(assemble(parts, snakemake.params.plan), snakemake.output.json, snakemake.output.markdown)
