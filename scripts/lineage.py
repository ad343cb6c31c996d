"""Write results/lineage.json: the chain of jobs behind the final checkpoint, its evaluation and
the report's plots (see draftline.lineage.provenance)."""

import json
import logging

from draftline.lineage.provenance import build_lineage
from draftline.runtime.atomic import atomic_file
from draftline.runtime.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    lineage = build_lineage(snakemake.input.checkpoint, snakemake.input.acceptance, *snakemake.input.plots)
    logging.info("lineage of %s: %s", snakemake.input.checkpoint, " -> ".join(s["rule"] for s in lineage["chain"]))
    with atomic_file(snakemake.output[0]) as out:
        json.dump(lineage, out, indent=1, sort_keys=True)
        out.write("\n")
