"""The server's process as it is started: a free port (free_port), the command line with the run's
engine settings as vLLM's flags (server_command, cli_flags) and its environment (server_env)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from draftline.backends.vllm_server.settings import ServerSettings
from draftline.runtime import pythonpath_with_draftline
from draftline.runtime.logs import CONFIGURE_LOGGING, LOGGING_CONFIG_PATH, is_job_logging
from draftline.runtime.vllm_engine import BIND, users_setting, vllm_cpu_env, vllm_cuda_env


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
    env = dict(os.environ)
    # the server logs to its own file, in vLLM's format (not through the job's log config)
    if not users_setting(CONFIGURE_LOGGING):
        env.pop(CONFIGURE_LOGGING, None)
    if is_job_logging(env):
        env.pop(LOGGING_CONFIG_PATH)
    env["PYTHONPATH"] = pythonpath_with_draftline(env)  # the CPU connector's module
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
