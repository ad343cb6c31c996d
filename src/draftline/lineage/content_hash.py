"""Content hashes that decide staleness: the same bytes give the same hash wherever they lie.

Snakemake compares params by value, so a content hash among a rule's params reruns the rule
exactly when the content changes: not when a folder moves, is restored from a backup or is
cloned afresh (new paths, new mtimes), and always when a file is rewritten in place.

`digest_files` hashes files by their relative names and bytes. Big files (model weights) are
hashed once and then looked up in a small cache keyed by (absolute path, size, mtime_ns,
ctime_ns), so a dry run over a 140 GB target costs a few stat calls; a moved copy is hashed once
more. ctime is in the key because a file rewritten in place with its size and mtime restored
(os.utime, `cp -p`, `touch -r`) looks unchanged by the other three, and ctime cannot be set back.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

# Files this small are always re-read: cheaper than trusting a stat key.
_ALWAYS_READ = 1 << 20


def sha256_file(path: str | Path, progress: Callable[[int], None] | None = None) -> str:
    """The sha256 of a file's bytes; `progress(n)` after each read of n bytes, where given."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle if progress is None else _Reporting(handle, progress), "sha256").hexdigest()


class _Reporting:
    """A binary file that tells `progress` what each read gave (file_digest reads with readinto)."""

    def __init__(self, handle, progress: Callable[[int], None]):
        self._handle, self._progress = handle, progress

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._handle.readinto(buffer)
        if n:
            self._progress(n)
        return n


class HashCache:
    """sha256 of big files by (absolute path, size, mtime_ns, ctime_ns), kept in one JSON file.

    A missing or unreadable cache file is an empty cache; it is rewritten atomically.
    """

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self._entries: dict[str, str] = {}
        self._dirty = False
        if self.path and self.path.is_file():
            try:
                self._entries = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self._entries = {}

    def sha256(self, path: Path) -> str:
        st = path.stat()
        if st.st_size <= _ALWAYS_READ:
            return sha256_file(path)
        key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        if key not in self._entries:
            self._entries[key] = sha256_file(path)
            self._dirty = True
        return self._entries[key]

    def save(self) -> None:
        if not (self.path and self._dirty):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._entries, indent=0, sort_keys=True))
        os.replace(tmp, self.path)
        self._dirty = False


def digest_files(files: Iterable[tuple[str, Path]], cache: HashCache | None = None) -> str:
    """One sha256 over (name, content hash) pairs, sorted by name; names are what the caller
    wants to be position-independent (relative paths, module names)."""
    cache = cache or HashCache(None)
    digest = hashlib.sha256()
    for name, path in sorted(files, key=lambda item: item[0]):
        digest.update(f"{name}\0{cache.sha256(Path(path))}\n".encode())
    return digest.hexdigest()


def digest_folder(folder: str | Path, cache: HashCache | None = None, skip: Iterable[str] = ()) -> str:
    """Content hash of every file under `folder` (symlinks followed), by relative path."""
    folder = Path(folder)
    skip = set(skip)
    files = [
        (str(p.relative_to(folder)), p)
        for p in folder.rglob("*")
        if p.is_file() and p.name not in skip and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    return digest_files(files, cache)


# Files and folders up to this many bytes are fingerprinted by content. Bigger ones (model
# weights, hidden-state shards) by content too when the caller gives a HashCache (each file read
# once per version: the target's, whose hashes the plan already made); else by each file's
# relative path, size, mtime and ctime: cheap, and it changes whenever a file is rewritten, in
# place or not, whatever is restored after (ctime cannot be set back), but also when a file is
# only copied, restored or re-linked to the same bytes (ctime again): then a training run key
# changes (a new run instead of a resume), never a result.
HASH_LIMIT = 64 * 2**20


def _stat_digest(files: Iterable[tuple[str, Path]]) -> str:
    digest = hashlib.sha256()
    for rel, path in files:
        st = path.stat()  # follows symlinks (the training view's links to shard files)
        digest.update(f"{rel}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}\n".encode())
    return digest.hexdigest()


def fingerprint(path: str | Path, limit: int = HASH_LIMIT, skip: Iterable[str] = (),
                cache: HashCache | None = None) -> dict:
    """The one fingerprint of a file or folder (symlinks followed) that provenance, training run
    keys and staging keys use: {"sha256": ...} of the content up to `limit` bytes (any size with
    `cache`), {"stat": ...} of names, sizes, mtimes and ctimes above it; {"missing": True} when
    absent. `digest(...)` is the hash alone."""
    path = Path(path)
    if not path.exists():
        return {"path": str(path), "missing": True}
    if path.is_file():
        size = path.stat().st_size
        if size <= limit or cache is not None:
            return {"path": str(path), "bytes": size, "sha256": (cache or HashCache(None)).sha256(path)}
        return {"path": str(path), "bytes": size, "stat": _stat_digest([(path.name, path)])}
    skip = set(skip)
    files = sorted(
        (str(p.relative_to(path)), p) for p in path.rglob("*") if p.is_file() and p.name not in skip
    )
    total = sum(p.stat().st_size for _, p in files)
    out = {"path": str(path), "files": len(files), "bytes": total}
    if total <= limit or cache is not None:
        out["sha256"] = digest_files(files, cache)
    else:
        out["stat"] = _stat_digest(files)
    return out


def digest(fp: dict) -> str:
    """The hash of a `fingerprint` (content or stat)."""
    return fp.get("sha256") or fp.get("stat") or "missing"
