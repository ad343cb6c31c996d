"""The server's process group, read through psutil: which of its processes still run
(group_alive), whether one of them listens on a port (group_listens_on), signals to all of them
(signal_group), and SIGTERM to the server when the job process dies (die_with_parent)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import psutil


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """SIGTERM to the server when the job process dies (even by SIGKILL, where no finally runs)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the finally/atexit stop still applies
        pass


def signal_group(pgid: int, sig: int) -> None:
    # killpg: the whole group at once (psutil signals one process at a time)
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_members(pgid: int) -> Iterator[psutil.Process]:
    """The group's running processes (zombies of exited members left out)."""
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                yield proc
        except (psutil.Error, OSError):  # it exited meanwhile
            continue


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs."""
    return next(group_members(pgid), None) is not None


def group_listens_on(pgid: int, port: int) -> bool:
    """Whether a process of the group holds a TCP socket (IPv4 or IPv6) listening on `port`."""
    for proc in group_members(pgid):
        try:
            sockets = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port for s in sockets):
            return True
    return False
