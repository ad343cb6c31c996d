"""Logging for a Snakemake step: everything, including the error that stops it, goes to its log."""

from __future__ import annotations

import logging
import sys


def log_to(path: str) -> None:
    """Send logging to `path` and record an uncaught exception there before the job fails."""
    logging.basicConfig(filename=path, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    previous = sys.excepthook

    def log_and_raise(kind, error, traceback):
        logging.getLogger("draftline").error("step failed: %s", error, exc_info=(kind, error, traceback))
        previous(kind, error, traceback)

    sys.excepthook = log_and_raise
