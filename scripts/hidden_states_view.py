"""One symlink per dataset row into the shard that holds it: the folder the Trainer reads."""

import logging

from draftline.hidden_states import build_view
from draftline.provenance import write_provenance

if __name__ == "__main__":
    logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    build_view(list(snakemake.input.shards), snakemake.output[0])
    write_provenance(snakemake)  # provenance.json in the artifact folder (issue 4)
