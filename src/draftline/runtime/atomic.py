"""Publish outputs atomically: write under a temporary name beside the target, fsync, then rename.

A job killed mid-way leaves only a `.tmp-*` name behind, never something that looks finished.
What is published is on disk before its name is (every file and folder fsynced, then the
rename, then the parent folder), so a crash of the machine cannot leave a published name over
unwritten bytes.

Over an existing folder the old one is removed only after the new one is in place:

- where the kernel and filesystem swap two names in one step (Linux `renameat2` with
  RENAME_EXCHANGE: ext4, xfs, btrfs, tmpfs), the new folder and the old one change names at once
  and the old one (now under the temporary name) is removed after;
- elsewhere (NFS, Lustre, macOS) the new folder is first renamed `.<name>.ready-*` (complete),
  the old one `.<name>.old-*`, then the new one into place. A kill between the two renames
  leaves both under those names and no `<name>`: the next `atomic_dir` on that path (or
  `recover`) finishes the swap, the complete new folder wins.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a staging folder; on success it replaces `path` (see the module: the old one is
    removed only once the new one is in place)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    recover(final)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; publish with normal modes
    try:
        yield staging
        fsync_tree(staging)
        _put_in_place(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _put_in_place(staging: Path, final: Path) -> None:
    if not os.path.lexists(final):
        os.rename(staging, final)
    elif _exchange(staging, final):
        _remove(staging)  # the old one, now under the temporary name
    else:
        suffix = staging.name.rsplit(".tmp-", 1)[-1]
        ready = final.with_name(f".{final.name}.ready-{suffix}")
        old = final.with_name(f".{final.name}.old-{suffix}")
        os.rename(staging, ready)  # complete: recover() may put it in place
        os.rename(final, old)
        _between_renames()
        os.rename(ready, final)
        _remove(old)
    _fsync_dir(final.parent)


def _between_renames() -> None:
    """Where a kill leaves both folders aside and none in place (a test stops here)."""


def recover(final: str | Path) -> None:
    """Finish a swap a kill interrupted (the rename fallback's `.ready-*`/`.old-*` folders): with
    no `final`, a complete new folder goes in place (else the old one goes back); leftovers of a
    finished swap are removed."""
    final = Path(final)
    if not final.parent.is_dir():
        return
    ready = sorted(final.parent.glob(f".{final.name}.ready-*"))
    old = sorted(final.parent.glob(f".{final.name}.old-*"))
    if not os.path.lexists(final) and (ready or old):
        back = ready[-1] if ready else old[-1]
        log.warning("%s: a kill interrupted its replacement; putting %s back in its place", final, back.name)
        os.rename(back, final)
        _fsync_dir(final.parent)
    for leftover in ready + old:
        if os.path.lexists(leftover):
            _remove(leftover)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` in one step (renameat2 RENAME_EXCHANGE); False where the
    system or filesystem cannot."""
    libc = _libc()
    if libc is None:
        return False
    done = libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    return done == 0


_LIBC: list = []


def _libc():
    if not _LIBC:
        lib = None
        name = ctypes.util.find_library("c")
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(name, use_errno=True) if name else None
        if lib is not None and not hasattr(lib, "renameat2"):
            lib = None
        _LIBC.append(lib)
    return _LIBC[0]


def fsync_tree(folder: Path) -> None:
    """fsync every regular file and folder under `folder` (symlinks are in their folder's entry)."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                _fsync_path(path, os.O_RDONLY)
        _fsync_dir(Path(root))


def _fsync_path(path: str | Path, flags: int) -> None:
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a filesystem that refuses fsync on this kind of file
        pass
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    _fsync_path(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **kwargs) -> Iterator:
    """Yield an open file under a temporary name; on success fsync it and rename it to `path`."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
