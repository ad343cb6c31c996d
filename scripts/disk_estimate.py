"""Estimate the hidden states' disk use before extraction; stop at hidden_states.max_disk_gb."""

from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.disk_estimate import Extraction, write_estimate

if __name__ == "__main__":
    log_to(snakemake.log[0])
    write_estimate(
        snakemake.input.summary,
        snakemake.input.layer_ids,
        str(snakemake.params.target_dir),
        snakemake.output[0],
        Extraction(snakemake.params.dtype, snakemake.params.shards, snakemake.params.format),
        # A param Snakemake does not compare: a new limit must not rerun (re-extract) the shards; the
        # plan checks a changed limit against an existing estimate. The lengths (for the settings that
        # would fit, named in the error; total_seq_len: hidden_states.mode online's working set)
        # decide no estimate.
        snakemake.params.limit,
        dataset_dir=snakemake.input.dataset,
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
