"""Merge the regeneration shards in the prompts file's order (see draftline.stages.regenerate)."""

from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.regenerate import merge_shards

if __name__ == "__main__":
    log_to(snakemake.log[0])
    merge_shards(
        snakemake.input.shards, snakemake.input.settings, snakemake.output.conversations, snakemake.output.summary,
        snakemake.output.answers,
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
