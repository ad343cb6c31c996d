"""The one fingerprint (draftline.lineage.content_hash) of files above its content limit: an in-place
rewrite that restores size and mtime is still seen, and with a hash cache a big file is read once
per version and fingerprinted by its bytes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from draftline.lineage import content_hash
from draftline.lineage.content_hash import HashCache, digest, fingerprint

BIG = 3 << 20  # above the always-read size (1 MiB); the tests lower the content limit below it
LIMIT = 1 << 20


def _rewrite_in_place(path: Path, flip: int) -> None:
    """Change one byte (`flip` 0 writes the same bytes), keeping size and mtime."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= flip
    time.sleep(0.02)  # ctime ticks coarsely; a real edit is never this close to the last one
    with open(path, "r+b") as handle:  # in place: same inode
        handle.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns, path.stat().st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def _weights(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    path = folder / "model.safetensors"
    path.write_bytes(os.urandom(BIG))
    return path


def test_a_big_file_rewritten_in_place_with_size_and_mtime_restored_changes_its_stat_fingerprint(tmp_path):
    weights = _weights(tmp_path / "model")
    before_file, before_folder = fingerprint(weights, limit=LIMIT), fingerprint(tmp_path / "model", limit=LIMIT)
    assert "stat" in before_file and "stat" in before_folder  # above the limit, no cache: by stat
    _rewrite_in_place(weights, 0x01)
    assert digest(fingerprint(weights, limit=LIMIT)) != digest(before_file)
    assert digest(fingerprint(tmp_path / "model", limit=LIMIT)) != digest(before_folder)


def test_with_a_cache_a_big_file_is_read_once_per_version_and_fingerprinted_by_content(tmp_path, monkeypatch):
    weights = _weights(tmp_path / "model")
    cache_file = tmp_path / "hash_cache.json"
    cache = HashCache(cache_file)
    first = fingerprint(tmp_path / "model", limit=LIMIT, cache=cache)
    cache.save()
    assert "sha256" in first

    read = []
    real = content_hash.sha256_file
    monkeypatch.setattr(content_hash, "sha256_file", lambda p: read.append(Path(p).name) or real(p))
    assert fingerprint(tmp_path / "model", limit=LIMIT, cache=HashCache(cache_file)) == first
    assert "model.safetensors" not in read  # a stat lookup, not a read

    _rewrite_in_place(weights, 0x01)
    cache = HashCache(cache_file)
    changed = fingerprint(tmp_path / "model", limit=LIMIT, cache=cache)
    cache.save()
    assert "model.safetensors" in read and digest(changed) != digest(first)
    _rewrite_in_place(weights, 0x01)  # the original bytes again: the original fingerprint
    assert digest(fingerprint(tmp_path / "model", limit=LIMIT, cache=HashCache(cache_file))) == digest(first)


def test_small_files_and_folders_keep_their_content_fingerprint(tmp_path):
    """Up to the limit nothing changed: the sha256 of (relative name, file sha256) pairs."""
    import hashlib

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.txt").write_text("bee")
    (tmp_path / "d" / "a.txt").write_text("ay")
    expected = hashlib.sha256()
    for name in ("a.txt", "b.txt"):
        expected.update(f"{name}\0{content_hash.sha256_file(tmp_path / 'd' / name)}\n".encode())
    assert fingerprint(tmp_path / "d")["sha256"] == expected.hexdigest()
    assert fingerprint(tmp_path / "d" / "a.txt")["sha256"] == hashlib.sha256(b"ay").hexdigest()
