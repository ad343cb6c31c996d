"""The server's process group, read from /proc: which of its processes still run (group_alive),
whether one of them listens on a port (group_listens_on), signals to all of them (signal_group),
and SIGTERM to the server when the job process dies (die_with_parent)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """SIGTERM to the server when the job process dies (even by SIGKILL, where no finally runs)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the finally/atexit stop still applies
        pass


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_members(pgid: int):
    """/proc entries of the group's running processes (zombies of exited members left out)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields after the name: state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            yield entry


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs."""
    return next(group_members(pgid), None) is not None


def listening_sockets(port: int) -> set[str]:
    """`socket:[inode]` of every TCP socket listening on `port` (IPv4 or IPv6), from /proc/net."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            # sl, local_address (hex ip:port), rem_address, st (0A = LISTEN), ..., inode (10th)
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{fields[9]}]")
    return found


def group_listens_on(pgid: int, port: int) -> bool:
    """Whether a process of the group holds the socket listening on `port`."""
    sockets = listening_sockets(port)
    if not sockets:
        return False
    for entry in group_members(pgid):
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in sockets:
                    return True
            except OSError:
                continue
    return False
