"""The Trainer's child process: its environment, its output forwarded into the step's log, and
the signals of a preempted or killed job. SIGTERM reaches the Trainer, which saves and exits; the
job then fails without publishing, and its rerun resumes from the last epoch or step checkpoint
(`draftline.stages.train.checkpoints`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from pathlib import Path

from draftline.runtime import pythonpath_with_draftline
from draftline.stages.train.args import launch_command
from draftline.stages.train.placement import Placement

log = logging.getLogger(__name__)

# Lines the Trainer prints on every run that no setting changes (not errors, not progress).
TRAINER_NOISE = (
    "`model.safetensors.index.json` file not found",
    "speculators.utils.loading:_resolve_file",  # "Loading from local directory: ..."
    "━━━━━━━━━━",  # speculators' per-epoch bars (rich), epochs counted from 0: `[draftline] step N/M` says it
)


def child_env(threads: int, metrics_path: Path, devices: list[str] | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath_with_draftline(env)
    env["DRAFTLINE_TORCH_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    env["DRAFTLINE_METRICS_PATH"] = str(metrics_path)
    env["COLUMNS"] = "160"  # speculators' rich console wraps at 80 columns off a terminal
    env["PYTHONUNBUFFERED"] = "1"
    # progress bars (transformers' "Writing model shards") redraw into the log; the
    # `[draftline] step N/M` lines say where training is
    env["TQDM_DISABLE"] = "1"
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    return env


def launch(args: list[str], where: Placement, metrics_path: Path, lock_timeout_s: float | None = None) -> None:
    """Run speculators' Trainer with `args` where placed; `lock_timeout_s`: online, how long it
    waits for each sample the server writes (train.entry.patch_lock_wait)."""
    command = launch_command(args, where.cuda, where.world_size)
    log.info("running: %s", " ".join(command))
    env = child_env(where.trainer_threads, metrics_path, where.trainer_devices)
    if lock_timeout_s is not None:
        env["DRAFTLINE_HS_LOCK_TIMEOUT_S"] = str(lock_timeout_s)
    run_trainer(command, env)


def run_trainer(command: list[str], env: dict) -> None:
    """Run the child, forwarding its output line by line into this step's log."""
    child_log = logging.getLogger("draftline.stages.train.speculators")
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc, _forward_sigterm(proc):
        tail: list[str] = []
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                line = line.rstrip()
                if line and not any(noise in line for noise in TRAINER_NOISE):
                    child_log.info("%s", line)
                    tail = (tail + [line])[-30:]
            proc.wait()
        except BaseException:
            proc.terminate()  # a killed job must not leave a trainer running
            try:  # speculators saves on SIGTERM; drain its output so it never blocks on a full pipe
                for line in proc.stdout:  # type: ignore[union-attr]
                    if line.strip():
                        child_log.info("%s", line.rstrip())
                proc.wait(timeout=120)
            except Exception:  # noqa: BLE001
                proc.kill()
            raise
    if proc.returncode != 0:
        raise RuntimeError(
            f"speculators' Trainer exited with status {proc.returncode}; last lines:\n" + "\n".join(tail)
        )


class Terminated(Exception):
    """SIGTERM reached the training job (Slurm preemption, a time limit, scancel)."""


@contextlib.contextmanager
def _forward_sigterm(proc: subprocess.Popen):
    """SIGTERM to this job (Slurm sends it to every process of a preempted or timed-out job, a
    local kill only to this one) is passed to the Trainer, which saves and exits; the job then
    fails without publishing, and its rerun resumes from the last epoch or step checkpoint.
    Without this the job would die at once and leave the Trainer running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        log.warning("received SIGTERM: stopping the Trainer (it resumes from its last checkpoint on a rerun)")
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_on_sigterm() -> None:
    """A terminated job (Snakemake, Slurm) unwinds: the Trainer and the server are stopped."""
    if threading.current_thread() is threading.main_thread():

        def handler(signum, frame):
            raise SystemExit(f"terminated by signal {signum}")

        signal.signal(signal.SIGTERM, handler)
