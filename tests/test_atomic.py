"""Atomic publishing (draftline.runtime.atomic): a kill at any point leaves the old folder or the new one
under the final name, or both under names the next publish puts right; never neither."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from draftline.runtime import atomic


def _folder(path, text):
    path.mkdir()
    (path / "a.txt").write_text(text)
    (path / "sub").mkdir()
    (path / "sub" / "b.txt").write_text(text * 2)


def _publish(final, text):
    with atomic.atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text(text)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text(text * 2)


def _content(folder):
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*.txt"))}


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_replacing_a_folder_puts_the_new_one_in_place_and_leaves_nothing_beside_it(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    elif atomic._libc() is None:
        pytest.skip("no renameat2 in this C library")
    final = tmp_path / "out"
    _folder(final, "old")
    _publish(final, "new")
    assert _content(final) == {"a.txt": "new", "sub/b.txt": "newnew"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _killed_between_renames(final: str) -> None:
    """A child process that publishes and is killed (no clean-up runs) between the rename of the
    old folder aside and the rename of the new one into place."""
    atomic._exchange = lambda a, b: False
    atomic._between_renames = lambda: os.kill(os.getpid(), 9)
    from pathlib import Path

    _publish(Path(final), "new")


def test_a_kill_between_the_renames_loses_neither_folder_and_the_next_publish_recovers(tmp_path):
    final = tmp_path / "out"
    _folder(final, "old")
    child = multiprocessing.get_context("fork").Process(target=_killed_between_renames, args=(str(final),))
    child.start()
    child.join(30)
    assert child.exitcode == -9
    # no final name, both folders whole beside it
    assert not final.exists()
    ready = list(tmp_path.glob(".out.ready-*"))
    old = list(tmp_path.glob(".out.old-*"))
    assert len(ready) == 1 and len(old) == 1
    assert _content(ready[0]) == {"a.txt": "new", "sub/b.txt": "newnew"}
    assert _content(old[0]) == {"a.txt": "old", "sub/b.txt": "oldold"}

    atomic.recover(final)  # what the next atomic_dir on this path does first
    assert _content(final) == {"a.txt": "new", "sub/b.txt": "newnew"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_recover_puts_the_old_folder_back_when_the_new_one_never_became_complete(tmp_path):
    _folder(tmp_path / ".out.old-x1", "old")
    atomic.recover(tmp_path / "out")
    assert _content(tmp_path / "out") == {"a.txt": "old", "sub/b.txt": "oldold"}


def test_a_failed_publish_keeps_the_old_folder(tmp_path):
    final = tmp_path / "out"
    _folder(final, "old")
    with pytest.raises(RuntimeError), atomic.atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("killed")
    assert _content(final) == {"a.txt": "old", "sub/b.txt": "oldold"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_everything_published_is_fsynced_before_its_name(tmp_path, monkeypatch):
    synced, real = [], os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    final = tmp_path / "out"
    with atomic.atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("x")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("y")
        staging = str(tmp)
    assert {f"{staging}/a.txt", f"{staging}/sub/b.txt", f"{staging}/sub", staging} <= set(synced)
    assert synced[-1] == str(tmp_path)  # the rename itself
    synced.clear()
    with atomic.atomic_file(tmp_path / "f.json") as handle:
        handle.write("{}")
    assert synced[-1] == str(tmp_path) and any(".f.json.tmp-" in s for s in synced)
