"""One plot for `snakemake --report` (params.plot names it; see draftline.stages.report)."""

from draftline.lineage.provenance import sidecar, write_provenance
from draftline.runtime.logs import log_to
from draftline.stages import report

if __name__ == "__main__":
    log_to(snakemake.log[0])
    out = snakemake.output[0]
    plot = snakemake.params.plot
    if plot == "loss":
        report.plot_loss(snakemake.input.final, out)
    elif plot == "acceptance":
        report.plot_acceptance(snakemake.input.acceptance, out)
    elif plot == "vocab_coverage":
        report.plot_vocab_coverage(snakemake.input.token_freq, snakemake.input.summary, out)
    elif plot == "hidden_states_disk":
        report.plot_hidden_states_disk(snakemake.input.shards, out)
    elif plot == "wall_times":
        report.plot_wall_times(snakemake.params.benchmarks, out)
    else:
        raise ValueError(f"params.plot = {plot!r}: no such plot in draftline.stages.report")
    write_provenance(snakemake, sidecar(out))  # results/report/<plot>.provenance.json
