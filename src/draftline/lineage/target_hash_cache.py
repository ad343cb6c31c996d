"""The content hashes of a local target's big files, made once per file version and shared by
every run folder of the user: hashing the weights of a 235B target reads 470 GB.

A local target folder's identity (draftline.stages.target_model.target_identity, a param of every rule
that reads the target) is the sha256 of all its files. `SharedHashCache` is the cache the plan
gives it: entries keyed, as `content_hash.HashCache` keys them, by a file's resolved path, size,
mtime and ctime (a file rewritten in place changes its ctime whatever else is restored), kept in
two places and read from both:

- the user's cache, `$DRAFTLINE_CACHE_DIR/target_hashes.json` (default
  `$XDG_CACHE_HOME/draftline/`, else `~/.cache/draftline/`): a second run folder on the same
  target, or a new checkout, finds the hashes there;
- the run folder's `.snakemake/draftline/hash_cache.json`: on the shared filesystem with the run,
  so a cluster job (which parses the workflow again on its node) finds them even where the
  user's cache directory is node-local.

Both are merged under a lock when written, so plans of several run folders at once lose nothing.
Before the first hash of a big folder, `hash_ahead` reads the files no cache knows with a
progress line (bytes, rate, time left) on the planning machine's terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock

from draftline.lineage.content_hash import _ALWAYS_READ, HashCache, sha256_file

SHARED_FILE = "target_hashes.json"
RUN_FILE = ".snakemake/draftline/hash_cache.json"  # relative to the run folder (a job's working folder)
# Above this many bytes still to hash, the plan says so and reports progress.
PROGRESS_MIN_BYTES = 1 << 30
PROGRESS_EVERY_S = 15.0


def user_cache_dir() -> Path:
    """Where the user's shared hashes live (DRAFTLINE_CACHE_DIR, else XDG_CACHE_HOME/draftline,
    else ~/.cache/draftline)."""
    if os.environ.get("DRAFTLINE_CACHE_DIR"):
        return Path(os.environ["DRAFTLINE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "draftline"


def stat_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _read(path: Path) -> dict[str, str]:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path` (flock; where the filesystem refuses it, none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path.with_name(f".{path.name}.lock"), fallback_to_soft=False)
    try:
        held = lock.acquire()
    except OSError:
        held = contextlib.nullcontext()
    with held:
        yield


class SharedHashCache(HashCache):
    """A HashCache read from the run folder's file and the user's shared one, written to both."""

    def __init__(self, run_path: str | Path, shared_path: str | Path | None = None):
        super().__init__(run_path)
        self.shared_path = Path(shared_path) if shared_path else user_cache_dir() / SHARED_FILE
        shared = _read(self.shared_path)
        self._in_run_folder = set(self._entries)
        # what this run folder hashed before the shared cache existed goes there too
        self._new: dict[str, str] = {k: v for k, v in self._entries.items() if k not in shared}
        self._dirty = bool(self._new)
        self._entries = {**shared, **self._entries}

    def sha256(self, path: Path) -> str:
        if path.stat().st_size <= _ALWAYS_READ:
            return super().sha256(path)  # read every time: cheaper than trusting a stat key
        key = stat_key(path)
        if key not in self._entries:
            self._remember(key, sha256_file(path))
        elif key not in self._in_run_folder:  # from the user's cache: the run folder keeps it too
            self._remember(key, self._entries[key])
        return self._entries[key]

    def _remember(self, key: str, digest: str) -> None:
        self._entries[key] = self._new[key] = digest
        self._in_run_folder.add(key)
        self._dirty = True

    def hash_ahead(self, files: list[Path], what: str, report: Callable[[str], None]) -> None:
        """Hash the big `files` no cache knows yet, reporting progress when they are large; the
        digest that follows then only looks them up."""
        todo = [(p, stat_key(p), p.stat().st_size) for p in files if p.stat().st_size > _ALWAYS_READ]
        todo = [(p, key, size) for p, key, size in todo if key not in self._entries]
        total = sum(size for _, _, size in todo)
        if not todo:
            return
        loud = total >= PROGRESS_MIN_BYTES
        if loud:
            report(f"hashing {what}: {_gb(total)} in {len(todo)} files no earlier plan has hashed (once per "
                   f"file version: the hashes are kept in {self.shared_path} and {self.path})")
        start = last = time.monotonic()
        done = 0

        def progress(n: int) -> None:
            nonlocal done, last
            done += n
            now = time.monotonic()
            if loud and now - last >= PROGRESS_EVERY_S:
                last = now
                rate = done / (now - start)
                report(f"hashing {what}: {_gb(done)} of {_gb(total)}, {_gb(rate)}/s, about "
                       f"{_duration((total - done) / rate)} left")

        for path, key, _ in todo:
            self._remember(key, sha256_file(path, progress))
            self.save()  # a plan stopped half-way keeps what it hashed
        if loud:
            report(f"hashed {what}: {_gb(total)} in {_duration(time.monotonic() - start)}")

    def save(self) -> None:
        if not self._dirty:
            return
        for path in (self.path, self.shared_path):
            if path is None:
                continue
            try:
                with _locked(path):
                    entries = _current({**_read(path), **self._new})
                    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                    tmp.write_text(json.dumps(entries, indent=0, sort_keys=True))
                    os.replace(tmp, path)
            except OSError:  # a read-only cache directory: the other file still has them
                continue
        self._dirty = False


def _current(entries: dict[str, str]) -> dict[str, str]:
    """The entries whose file is still there as it was hashed: a cache used by every run folder
    (and every test's temporary target) would otherwise only grow."""

    def still(key: str) -> bool:
        try:
            return stat_key(Path(key.rsplit(":", 3)[0])) == key
        except OSError:
            return False

    return {key: digest for key, digest in entries.items() if still(key)}


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def local_target_files(spec, root: str | Path) -> tuple[Path, list[Path]] | None:
    """(folder, files) that target_identity hashes for a local target `spec` (a
    target_model.TargetSpec): the user's folder (a chat-template view's source, else the folder
    itself) and its files as content_hash.digest_folder lists them; None for other kinds."""
    if spec.kind != "local":
        return None
    folder = Path(spec.source) if spec.needs_rule else Path(spec.dir)
    folder = folder if folder.is_absolute() else Path(root) / folder
    files = [
        p for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    return folder, files


def job_cache() -> SharedHashCache:
    """The cache a job reads the plan's hashes from: the run folder's (a job runs in it; a cluster
    node finds it on the shared filesystem) and the user's; outside a run folder the user's only."""
    return SharedHashCache(RUN_FILE if Path(".snakemake").is_dir() else None)
