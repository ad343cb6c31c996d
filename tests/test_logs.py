"""A job's log (draftline.runtime.logs.log_to): the lines vLLM, torch and speculators print on draftline's
path that mean nothing is wrong are left out; a real error or warning is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# a job's own process: log_to changes this process's logging, warnings and loguru for good
JOB = textwrap.dedent("""
    import logging, sys, warnings
    sys.path.insert(0, sys.argv[2])
    from draftline.runtime.logs import log_to
    log_to(sys.argv[1])
    cpu = logging.getLogger("vllm.v1.worker.cpu_worker")
    cpu.warning("%s is not found in LD_PRELOAD. For best performance, please follow ...", "libtcmalloc")
    cpu.warning("Speculative decoding on CPU without Intel OpenMP in LD_PRELOAD will cause ...")
    logging.getLogger("vllm.v1.utils").warning(
        "[shutdown] Process manager: force killing remaining process %s pid %d", "EngineCore", 4242)
    logging.getLogger("vllm.triton_utils.importing").info("Triton is installed, but doesn't include CPU backend.")
    logging.getLogger("vllm.v1.engine.core").error("EngineCore failed to start: CUDA out of memory")
    logging.getLogger("vllm.config").warning("max_num_scheduled_tokens is set to 4096 based on ...")
    logging.getLogger("draftline.stages.regenerate").info("shard 0/1: 15 to answer")
    warnings.warn("--target-layer-ids is not explicitly set. Setting target layers to [2, 15, 27].")
    warnings.warn("`torch.distributed.reduce_op` is deprecated", FutureWarning)
    warnings.warn("Tokenizer does not have mask_token; using pad_token_id=0")
    from loguru import logger
    logger = logger.patch(lambda record: record.update(name="speculators.utils.loading"))  # as speculators logs
    logger.warning("`model.safetensors.index.json` file not found. Checking for `model.safetensors` instead.")
    logger.warning("Tensor 'lm_head.weight' not found in weight_map.")
""")


def test_a_job_log_leaves_out_the_known_harmless_lines_and_keeps_the_rest(tmp_path):
    log = tmp_path / "job.log"
    run = subprocess.run([sys.executable, "-c", JOB, str(log), str(REPO / "src")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    text = log.read_text()
    for harmless in ["LD_PRELOAD", "force killing", "Triton is installed", "--target-layer-ids", "reduce_op",
                     "model.safetensors.index.json"]:
        assert harmless not in text, harmless
        assert harmless not in run.stderr + run.stdout, harmless  # nor on the terminal
    for kept in ["EngineCore failed to start: CUDA out of memory", "max_num_scheduled_tokens is set to 4096",
                 "shard 0/1: 15 to answer", "Tokenizer does not have mask_token",
                 "Tensor 'lm_head.weight' not found in weight_map"]:
        assert kept in text, kept
    assert "lm_head.weight" not in run.stderr  # speculators' loguru lines go to the job's log, not the terminal


# a job whose engine runs its core in a process of its own (as every engine on CUDA does, and
# extraction's on CPU) and cannot start it: no KV cache memory (vllm.cpu_kv_cache_gib 0)
ENGINE_JOB = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from draftline.runtime.logs import log_to
    from draftline.runtime.vllm_engine import EngineSettings, target_llm

    if __name__ == "__main__":
        log_to(sys.argv[1])
        settings = EngineSettings(max_model_len=256, dtype="float32", enforce_eager=True, threads=1, cpu_kv_cache_gib=0)
        target_llm(sys.argv[3], settings, in_process=False)
""")


@pytest.mark.dag
def test_an_engine_process_that_fails_to_start_leaves_its_cause_in_the_job_log(tmp_path, tiny_model):
    """vLLM's engine core and worker processes log through the job's logging config: the root cause
    of a failed start is in the job's log (the job's own error only says "See root cause above"),
    the engine's own lines too, and their known harmless lines are left out there as well."""
    job, log = tmp_path / "job.py", tmp_path / "job.log"
    job.write_text(ENGINE_JOB)
    # none of the VLLM_* this test process may hold (conftest's KV cache size, an in-process engine
    # a module's fixture started): in the job they would be the user's, and win
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    run = subprocess.run([sys.executable, str(job), str(log), str(REPO / "src"), str(tiny_model)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode != 0
    text = log.read_text()
    assert "See root cause above" in text, (run.returncode, run.stderr[-3000:])  # the job's process: the error that stops the job
    assert "vllm.v1.engine.core EngineCore failed to start" in text  # the engine core's process
    assert "No available memory for the cache blocks" in text  # with its cause
    assert "Explicitly set (0.0/" in text  # the worker's process: the KV cache it was given
    for harmless in ("Model Runner V2 requires Triton", "Enforce eager set, disabling torch.compile"):
        assert harmless not in text and harmless not in run.stderr, harmless


def test_a_users_own_vllm_logging_wins(monkeypatch):
    from draftline.runtime.logs import send_vllm_logs_to

    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "1")  # vLLM's console handler, as the user asked
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    send_vllm_logs_to("job.log")
    assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ


# a job's process that then starts a plain Python process, as vLLM does on CUDA to inspect the
# model's architecture (`python -m vllm.model_executor.models.registry`): that process inherits the
# environment, not the job's sys.path, and configures its logging from VLLM_LOGGING_CONFIG_PATH as
# vLLM does (vLLM 0.26 at `import vllm`, 0.32 when it starts an engine: `dictConfig` of the file)
SUBPROCESS_JOB = textwrap.dedent("""
    import subprocess, sys
    sys.path.insert(0, sys.argv[2])
    from draftline.runtime.logs import log_to
    log_to(sys.argv[1])
    child = (
        "import json, logging, logging.config, os;"
        "logging.config.dictConfig(json.load(open(os.environ['VLLM_LOGGING_CONFIG_PATH'])));"
        "logging.getLogger('vllm.model_executor.models.registry').warning('inspected')"
    )
    sys.exit(subprocess.run([sys.executable, "-c", child]).returncode)
""")


def test_a_process_a_job_starts_reads_the_vllm_logging_config_and_logs_to_the_job(tmp_path):
    """On CUDA vLLM inspects the target's architecture in a new Python process: with the job's
    logging config its `import vllm` must find draftline's handler, though draftline is not
    installed (2026-12-05 on an H100: the first engine failed "Model architectures failed to be
    inspected", its cause "Cannot resolve 'draftline.runtime.logs.job_log_handler'")."""
    log = tmp_path / "job.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_") and k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", SUBPROCESS_JOB, str(log), str(REPO / "src")], capture_output=True,
                         text=True, timeout=180, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "vllm.model_executor.models.registry inspected" in log.read_text()
