"""Logging for a Snakemake step: everything, including the error that stops it, goes to its log."""

from __future__ import annotations

import logging
import sys

# (logger, message start) of records every job of a kind repeats that no setting changes: vLLM's
# three lines on why Triton is off, which it prints in every job without a usable Triton.
NOISE = (
    ("vllm.triton_utils.importing", "Triton is installed"),
    ("vllm.triton_utils.importing", "Triton not installed"),
)


def _not_noise(record: logging.LogRecord) -> bool:
    return not any(record.name == name and str(record.msg).startswith(start) for name, start in NOISE)


def log_to(path: str) -> None:
    """Send logging to `path` and record an uncaught exception there before the job fails."""
    logging.basicConfig(filename=path, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_noise)
    previous = sys.excepthook

    def log_and_raise(kind, error, traceback):
        logging.getLogger("draftline").error("step failed: %s", error, exc_info=(kind, error, traceback))
        previous(kind, error, traceback)

    sys.excepthook = log_and_raise
