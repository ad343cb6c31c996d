"""One symlink per dataset row into the shard that holds it: the folder the Trainer reads."""

from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.hidden_states import build_training_view

if __name__ == "__main__":
    log_to(snakemake.log[0])
    build_training_view(list(snakemake.input.shards), snakemake.output[0])
    write_provenance(snakemake)  # provenance.json beside the artifact
