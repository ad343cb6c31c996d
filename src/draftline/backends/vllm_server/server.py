"""The server for the lifetime of a `with` block (VllmServer): started on a free port (retried
when another process takes it first), ready once its own socket answers, stopped with its whole
process group."""

from __future__ import annotations

import atexit
import logging
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from draftline.backends.vllm_server.command import free_port, server_command, server_env
from draftline.backends.vllm_server.process_group import die_with_parent, group_alive, group_listens_on, signal_group
from draftline.backends.vllm_server.settings import ServerSettings

log = logging.getLogger(__name__)

STOP_GRACE_S = 30.0
PORT_ATTEMPTS = 3


class ServerError(RuntimeError):
    pass


class VllmServer:
    """The extraction server for the lifetime of a `with` block."""

    def __init__(self, settings: ServerSettings, storage_dir: str | Path, log_path: str | Path,
                 ready_timeout_s: float = 900.0, devices: list[str] | None = None):
        self.settings = settings
        self.storage_dir = Path(storage_dir)
        self.log_path = Path(log_path)
        self.ready_timeout_s = ready_timeout_s
        self.devices = devices
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.ready_s: float | None = None
        self._log_start = 0  # where this attempt's lines begin in the (appended) log

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = free_port()
            command = server_command(self.settings, self.port, self.storage_dir)
            log.info("starting the hidden-state server (attempt %d): %s", attempt, " ".join(command))
            atexit.register(self.stop)  # again on a retry: the failed attempt's stop() unregistered it
            # the log is appended to (earlier jobs, earlier attempts): only this attempt's lines
            # decide whether its port was taken
            self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "a") as out:
                out.write(f"\n# draftline: {' '.join(command)}\n")
                out.flush()
                self.proc = subprocess.Popen(
                    command, env=server_env(self.settings, self.devices), stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent,
                )
            log.info("server pid %d (process group of its own), port %d, log %s",
                     self.proc.pid, self.port, self.log_path)
            if self._wait_ready(t0):
                self.ready_s = time.monotonic() - t0
                log.info("hidden-state server ready at %s after %.1f s", self.endpoint, self.ready_s)
                return
            tail = self._log_tail()
            self.stop()
            if "address already in use" not in tail.lower() or attempt == PORT_ATTEMPTS:
                raise ServerError(
                    f"the vLLM hidden-state server for {self.settings.target_dir} exited with status "
                    f"{self.proc.returncode} before it was ready; its log is {self.log_path}. Last lines:\n{tail}"
                )
            log.warning("port %d was taken before the server bound it; trying another", self.port)

    def _wait_ready(self, t0: float) -> bool:
        """True once the server answers on its own socket; False if it exited; ServerError after
        the timeout."""
        url = f"{self.endpoint}/models"
        while True:
            if self.proc.poll() is not None:
                return False
            # vLLM binds with SO_REUSEADDR long before it listens, so a second server can bind the
            # same port and hear the first's 200 until its own listen() fails: ask only our socket
            if group_listens_on(self.proc.pid, self.port):
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        if response.status == 200:
                            return True
                except (urllib.error.URLError, OSError):
                    pass
            if time.monotonic() - t0 > self.ready_timeout_s:
                tail = self._log_tail()
                self.stop()
                raise ServerError(
                    f"the vLLM hidden-state server did not answer at {url} within "
                    f"{self.ready_timeout_s:.0f} s (hidden_states.online_server_timeout_s); its log is "
                    f"{self.log_path}. Last lines:\n{tail}"
                )
            time.sleep(1.0)

    def _log_tail(self, lines: int = 30) -> str:
        """The last lines the current attempt wrote to the log."""
        try:
            text = self.log_path.read_bytes()[self._log_start:].decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after a grace period."""
        atexit.unregister(self.stop)
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the group id is the server's pid
        if group_alive(pgid):
            log.info("stopping the hidden-state server (process group %d)", pgid)
            signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while group_alive(pgid) and time.monotonic() < deadline:
                if proc.poll() is None:
                    try:
                        proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.2)
            if group_alive(pgid):
                log.warning("the server's processes outlived SIGTERM by %.0f s: SIGKILL", STOP_GRACE_S)
                signal_group(pgid, signal.SIGKILL)
                while group_alive(pgid) and time.monotonic() < deadline + 10:
                    time.sleep(0.2)
        if proc.poll() is None:
            proc.wait(timeout=10)
