"""Publish outputs atomically: write under a temporary name beside the target, then rename.

A job killed mid-way leaves only a `.tmp-*` name behind, never something that looks finished.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a staging folder; on success it replaces `path` in one rename."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; publish with normal modes
    try:
        yield staging
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **kwargs) -> Iterator:
    """Yield an open file under a temporary name; on success rename it to `path`."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
