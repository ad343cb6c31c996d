"""Resolve the configured hidden-state layer ids against the target's depth."""

import logging

from draftline.artifacts import layer_ids
from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.layer_ids import resolve_layer_ids

if __name__ == "__main__":
    log_to(snakemake.log[0])
    ids = resolve_layer_ids(
        snakemake.params.layer_ids, str(snakemake.params.target_dir), snakemake.params.trust_remote_code
    )
    logging.info("layer ids: %s", ids.to_json())
    layer_ids.write(snakemake.output[0], ids)
    write_provenance(snakemake)  # provenance.json beside the artifact
