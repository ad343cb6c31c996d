"""The `preflight` target: print the report, and fail when a check failed (see draftline.preflight)."""

import json
import logging
import sys
from pathlib import Path

from draftline.preflight import PreflightFailed, verdict
from draftline.runtime.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    print(Path(snakemake.input.markdown).read_text(), file=sys.stderr)
    parts = {name: snakemake.input[name] for name in ("environment", "regenerate", "hidden_states", "speculative", "training")}
    try:
        verdict(json.loads(Path(snakemake.input.json).read_text()), parts, snakemake.input.markdown)
    except PreflightFailed as failure:  # an answer, not a crash: no traceback
        logging.getLogger("draftline").error("%s", failure)
        print(f"draftline: {failure}", file=sys.stderr)
        sys.exit(1)
