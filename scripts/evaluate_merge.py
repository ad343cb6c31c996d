"""results/eval/acceptance.json from the per-set records and the baseline's (see draftline.stages.evaluate_merge)."""

from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.evaluate_merge import merge

if __name__ == "__main__":
    log_to(snakemake.log[0])
    merge(dict(zip(snakemake.params.sets, snakemake.input.sets, strict=True)), snakemake.input.baseline,
          snakemake.output.acceptance)
    write_provenance(snakemake)  # results/eval/provenance.json
