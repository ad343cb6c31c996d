"""`hidden_states.mode: online`: the vLLM server this job starts for the target
(`backends.vllm_server`). Its states are checked on a few rows (`draftline.fidelity`) before the
Trainer starts; the Trainer then runs with `--on-missing generate` against it, and the server is
stopped when training ends or fails. The run key holds the server's settings in place of the
files' fingerprint."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from draftline import fidelity
from draftline.artifacts import layer_ids
from draftline.stages.train.placement import Placement
from draftline.stages.train.settings import HiddenStateSource, TrainInputs

log = logging.getLogger(__name__)

def server_settings(inputs: TrainInputs, source: HiddenStateSource, where: Placement, trust_remote_code: bool):
    """The server's `ServerSettings`: the run's vLLM settings (`source.engine`, the one object every
    vLLM job gets; without it the defaults with the planned dtype), with the context of a row plus
    the one generated token, on the devices or threads placed for it."""
    from draftline.backends.vllm_server import ServerSettings
    from draftline.runtime.vllm_engine import EngineSettings

    engine = source.engine or EngineSettings(dtype=source.dtype, trust_remote_code=trust_remote_code)
    return ServerSettings(
        target_dir=str(inputs.target),
        extracted=tuple(layer_ids.read(inputs.layer_ids).extracted),
        engine=replace(engine, max_model_len=source.max_seq_len + 1, threads=where.server_threads),
        cuda=where.cuda,
    )


def server_key(server) -> dict | None:
    """What decides the server's states (its thread count, memory, eager mode and port do not); None offline."""
    return server.key() if server is not None else None


def train_online(inputs: TrainInputs, source: HiddenStateSource, server, where: Placement, run_dir: Path,
                 run: Callable[[TrainInputs, str], None]) -> dict:
    """Start the server, check its states, and `run(inputs, endpoint)` the Trainer against it
    (reading its files from a scratch folder in `run_dir`); return the provenance record."""
    from draftline.backends.vllm_server import VllmServer

    # the server writes each sample's file here; the Trainer reads and deletes it
    scratch = run_dir / "online_hidden_states"
    shutil.rmtree(scratch, ignore_errors=True)
    with VllmServer(server, scratch, source.server_log, source.ready_timeout_s, where.server_devices) as running:
        checked = check_online_fidelity(inputs, running.endpoint, source, server, server.engine.trust_remote_code)
        run(replace(inputs, hidden_states=scratch), running.endpoint)
        ready_s = running.ready_s
    shutil.rmtree(scratch, ignore_errors=True)
    return {"mode": "online", "server": server.record(), "server_ready_s": ready_s,
            "server_log": str(source.server_log),
            "server_devices": where.server_devices, "trainer_devices": where.trainer_devices,
            "fidelity": checked}


def check_online_fidelity(inputs: TrainInputs, endpoint: str, source: HiddenStateSource, server,
                          trust_remote_code: bool = False) -> dict | None:
    """Online mode, before the Trainer starts: ask the running server for `source.fidelity.rows`
    rows' states (spread over the dataset, as the Trainer would ask for them) and check them
    (`draftline.fidelity`); return the record for provenance. A failure stops the job (the
    server is stopped on the way out) before any training step."""
    from datasets import load_from_disk

    from draftline.backends.vllm_server import ServerError, request_states

    settings = source.fidelity
    if settings.rows <= 0:
        return None
    t0 = time.monotonic()
    dataset = load_from_disk(str(inputs.dataset))
    sample = fidelity.sample_rows(range(len(dataset)), settings.rows)
    picked = dataset.select(sample).with_format(None)
    ids = dict(zip(sample, picked["input_ids"], strict=True))
    try:
        states = request_states(endpoint, ids, timeout_s=source.ready_timeout_s)
    except ServerError as err:
        raise ServerError(f"the fidelity check before training (rows {sample}) asked the online hidden-state "
                          f"server for {inputs.target}: {err} (log {source.server_log})") from err
    head = fidelity.read_head(inputs.target, trust_remote_code)
    measured = fidelity.measure(
        head, [fidelity.Sample(r, states[r], ids[r], m) for r, m in zip(sample, picked["loss_mask"], strict=True)],
        server.extracted,
    )
    where = f"the online hidden-state server for {inputs.target} (log {source.server_log})"
    log.info("fidelity of %s: rows %s: top-1 agreement %s on %d assistant positions (bar %s, %s), %s on all (%.1f s)",
             where, sample, measured["top1_assistant"], measured["assistant_tokens"], settings.min_top1,
             settings.basis, measured["top1_all"], time.monotonic() - t0)
    fidelity.check(measured, settings.min_top1, where, settings.basis)
    return fidelity.record(measured, settings)
