"""Resolve the configured hidden-state layer ids against the target's depth."""

import json
import logging

from draftline.atomic import atomic_file
from draftline.layers import resolve_layer_ids
from draftline.provenance import write_provenance
from draftline.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    ids = resolve_layer_ids(
        snakemake.params.layer_ids, str(snakemake.params.target_dir), snakemake.params.trust_remote_code
    )
    record = {"aux": ids.aux, "extracted": ids.extracted, "num_hidden_layers": ids.num_hidden_layers}
    logging.info("layer ids: %s", record)
    with atomic_file(snakemake.output[0]) as out:
        json.dump(record, out, indent=1)
        out.write("\n")
    write_provenance(snakemake)  # provenance.json beside the artifact
