"""Logging for a Snakemake step: everything, including the error that stops it, goes to its log,
less the lines vLLM, torch and speculators print on draftline's path that no setting changes and
that mean nothing is wrong (docs/pipeline.md, "Warnings you may see", lists the rest)."""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from pathlib import Path

from draftline.runtime import pythonpath_with_draftline

FORMAT = "%(asctime)s %(name)s %(message)s"
# vLLM's own processes (below: send_vllm_logs_to)
CONFIGURE_LOGGING = "VLLM_CONFIGURE_LOGGING"  # "0": vLLM adds no console handler of its own
LOGGING_CONFIG_PATH = "VLLM_LOGGING_CONFIG_PATH"  # a dictConfig file every process reads at `import vllm`
JOB_LOG = "DRAFTLINE_JOB_LOG"
VLLM_LOGGING_CONFIG = Path(__file__).with_name("vllm_logging.json")

# (logger, text in the message) of records that are harmless where draftline runs vLLM; a logger
# names itself and its children ("vllm" is every vLLM module).
NOISE = (
    # why Triton is off: every job without a usable Triton (CPU), with no effect on outputs
    ("vllm.triton_utils.importing", "Triton is installed"),
    ("vllm.triton_utils.importing", "Triton not installed"),
    ("vllm", "Triton is not installed. triton-cpu is expected"),
    ("vllm", "Model Runner V2 requires Triton"),
    ("vllm", "Model Runner V2 does not yet support speculative method 'extract_hidden_states'"),
    # vLLM CPU's advice on speed (tcmalloc, Intel OpenMP preloaded); draftline's CPU path is for
    # small models and tests, and sets the job's threads itself (engine.configure_vllm_cpu)
    ("vllm", "is not found in LD_PRELOAD"),
    ("vllm", "without Intel OpenMP in LD_PRELOAD"),
    ("vllm", "doesn't allow to use `torch.set_num_threads` after the thread binding"),
    # draftline's choices: an in-process engine core with a seed, enforce_eager on CPU
    ("vllm", "Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False"),
    ("vllm", "Enforce eager set, disabling torch.compile"),
    ("vllm", "Inductor compilation was disabled by user settings"),
    # extraction's engine (the extract_hidden_states method and its KV connector) and the second
    # engine of a job (evaluation: the target alone, then with each draft)
    ("vllm", "Initializing KVConnectorBase_V1. This API is experimental"),
    ("vllm", "with CacheOnlyAttentionBackend backend"),
    ("vllm", "`torch.compile` is turned on, but the model"),
    ("vllm", "min_p and logit_bias parameters won't work with speculative decoding"),
    ("vllm", "is already registered. Overwriting."),
    # engine.shutdown after the job's outputs are written (and checked)
    ("vllm", "force killing remaining process"),
    # speculators reading a target stored as one model.safetensors
    ("speculators.utils.loading", "`model.safetensors.index.json` file not found"),
    ("speculators.utils.loading", "Loading from local directory"),
)

# (category, message start) of Python warnings that are harmless on draftline's path.
WARNING_NOISE = (
    # the layer_ids job resolves `auto` through speculators on purpose and logs the ids it chose;
    # extraction, the speculator config and training all read them from results/target/layer_ids.json
    (UserWarning, "--target-layer-ids is not explicitly set"),
    (FutureWarning, "`torch.distributed.reduce_op` is deprecated"),  # vLLM's kernel dispatcher, on import
)


def is_noise(record: logging.LogRecord) -> bool:
    """Whether `record` is one of NOISE."""
    message = record.getMessage()
    return any(
        (record.name == name or record.name.startswith(name + ".")) and text in message for name, text in NOISE
    )


def _not_noise(record: logging.LogRecord) -> bool:
    return not is_noise(record)


def ignore_warning_noise() -> None:
    """Leave out the Python warnings of WARNING_NOISE in this process."""
    for category, start in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=re.escape(start), category=category)


def _speculators_to_logging() -> None:
    """speculators logs with loguru to stderr: send its records into this job's log instead,
    through the same filter."""
    try:
        from loguru import logger
    except ImportError:
        return

    def sink(message) -> None:
        record = message.record
        logging.getLogger(record["name"] or "speculators").log(record["level"].no, "%s", record["message"])

    logger.remove()
    logger.add(sink, level="INFO", format="{message}")


def job_log_handler() -> logging.Handler:
    """The handler vllm_logging.json names: this job's log (JOB_LOG) in the job's format, less NOISE;
    standard error where no job log is set. Runs in each process that imports vLLM."""
    path = os.environ.get(JOB_LOG)
    handler = logging.FileHandler(path) if path else logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(_not_noise)
    ignore_warning_noise()
    return handler


def send_vllm_logs_to(path: str) -> None:
    """vLLM's engine core and worker processes (every engine on CUDA; on CPU extraction's and those
    of several ranks) start without this job's logging: they configure their own from
    VLLM_LOGGING_CONFIG_PATH when they import vLLM. Pointed at vllm_logging.json, their records (the
    KV cache size, load and compile times, the root cause of an engine that fails to start) reach
    the job's log as the job's own do, less NOISE, instead of the terminal. The job's process reads
    the same config (one handler, the same lines). A user's VLLM_CONFIGURE_LOGGING or
    VLLM_LOGGING_CONFIG_PATH wins."""
    if CONFIGURE_LOGGING in os.environ or LOGGING_CONFIG_PATH in os.environ:
        return
    os.environ[JOB_LOG] = os.path.abspath(path)
    os.environ[LOGGING_CONFIG_PATH] = str(VLLM_LOGGING_CONFIG)
    # the config's handler is draftline's: a process vLLM starts with subprocess (on CUDA the model
    # registry's inspection, `python -m vllm.model_executor.models.registry`) must import it too
    os.environ["PYTHONPATH"] = pythonpath_with_draftline(os.environ)


def is_job_logging(env: dict) -> bool:
    """Whether `env` sends vLLM's records to a job's log (send_vllm_logs_to): a process that
    keeps a log of its own (the online server) leaves that out."""
    return env.get(LOGGING_CONFIG_PATH) == str(VLLM_LOGGING_CONFIG)


def log_to(path: str) -> None:
    """Send logging to `path`, vLLM's processes' included, and record an uncaught exception there
    before the job fails."""
    logging.basicConfig(filename=path, level=logging.INFO, format=FORMAT)
    send_vllm_logs_to(path)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_noise)
    ignore_warning_noise()
    logging.captureWarnings(True)  # the other warnings go to the job's log, not the terminal
    _speculators_to_logging()
    previous = sys.excepthook

    def log_and_raise(kind, error, traceback):
        logging.getLogger("draftline").error("step failed: %s", error, exc_info=(kind, error, traceback))
        previous(kind, error, traceback)

    sys.excepthook = log_and_raise
