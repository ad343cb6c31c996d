"""The `preflight` target's verdict on the assembled report (`artifacts.preflight`): fail naming
every failed check, after removing the parts that hold them so the next `preflight` reruns them."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from draftline.artifacts.preflight import part_failures, read_part

log = logging.getLogger(__name__)


class PreflightFailed(RuntimeError):
    """Some preflight check failed; the report says which and what to fix."""


def verdict(report: dict, parts: dict[str, str | Path], report_md: str | Path) -> None:
    """Raise PreflightFailed naming the failed checks after removing the parts that hold them,
    so the next `preflight` reruns those parts (and what follows them) instead of reporting the
    same results again."""
    if report["ok"]:
        log.info("preflight: all %d checks passed or were not needed", len(report["checks"]))
        return
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    for folder in parts.values():
        if part_failures(read_part(folder)):
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed %s: its failed checks rerun with the next `preflight`", folder)
    lines = "; ".join(f"{c['name']}: {c['reason']}" for c in failing)
    raise PreflightFailed(f"{len(failing)} preflight check(s) failed (details in {report_md}): {lines}")
