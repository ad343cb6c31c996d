"""speculators' own training entry point, plus CPU shims and a metrics log.

    python -m draftline.train_entry <speculators train flags>            # CPU or 1 GPU
    torchrun --nproc_per_node N -m draftline.train_entry <flags>         # N GPUs

It runs exactly what `python -m speculators.train` runs (`cli.main(TrainConfig.resolve())`),
after three narrow additions:
- CPU shims, only when no accelerator exists: speculators 0.9.0 assumes one. Its trainer
  moves the model to `get_local_rank()` (0 = cuda:0), its step timer calls
  `torch.accelerator.synchronize()`, and its checkpointer loads a resumed checkpoint onto
  `get_current_device()` ("cuda:0" without an accelerator).
- torch intra-op threads = $DRAFTLINE_TORCH_THREADS (the job's threads).
- online hidden states ($DRAFTLINE_HS_LOCK_TIMEOUT_S set): hs_connectors' `wait_for_lock`, which
  the file transfer calls before reading each sample the server wrote, waits that long instead
  of its fixed 10 s. vLLM's connector holds the file's lock until the write ends and drops it
  when its process dies, so a longer wait cannot hang on a dead server; on a loaded CPU machine
  the write took longer than 10 s for 10 of 61 samples, each then recomputed ("Timed out
  waiting for lock").
- every metrics record speculators logs (per step: loss, tokens/s; per epoch: val loss) is
  appended as one JSON line to $DRAFTLINE_METRICS_PATH (rank 0), and summarised as
  progress lines on stdout.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from draftline.artifacts import metrics

PROGRESS_EVERY_S = 10.0


def has_accelerator() -> bool:
    import torch

    return torch.accelerator.current_accelerator(check_available=True) is not None


def apply_cpu_shims() -> None:
    """Let speculators' Trainer run on the CPU (no-ops where an accelerator exists)."""
    import torch

    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer

    trainer.get_local_rank = lambda: "cpu"
    checkpointer.get_current_device = lambda: "cpu"
    real_synchronize = torch.accelerator.synchronize

    def synchronize(device=None):
        if torch.accelerator.current_accelerator(check_available=True) is None:
            return None
        return real_synchronize(device)

    torch.accelerator.synchronize = synchronize


def patch_lock_wait(timeout_s: float) -> None:
    """Wait up to `timeout_s` for each sample's write lock (see the module docstring)."""
    import hs_connectors.transfer as transfer

    real = transfer.wait_for_lock

    def wait_for_lock(lock_path, timeout=10.0, poll_interval=0.1):
        return real(lock_path, timeout=max(float(timeout), timeout_s), poll_interval=poll_interval)

    transfer.wait_for_lock = wait_for_lock


def _worker_init(worker_id: int) -> None:
    """speculators' loader-worker init, then the lock wait (a spawned worker imports afresh)."""
    import speculators.train.dataloader as dataloader

    dataloader._worker_init_fn(worker_id)  # in the worker: speculators' own (unpatched import)
    patch_lock_wait(float(os.environ["DRAFTLINE_HS_LOCK_TIMEOUT_S"]))


def patch_lock_wait_in_workers() -> None:
    """The loader's workers are spawned: they get the patch through their init function."""
    import speculators.train.dataloader as dataloader

    dataloader._worker_init_fn = _worker_init


def _progress(line: str) -> None:
    # Plain lines (not speculators' rich console) so the step's log stays greppable.
    print(f"[draftline] {line}", flush=True)


def _human(epoch) -> str:
    return str(epoch + 1) if isinstance(epoch, int) else str(epoch)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{float(value):.4f}"


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0


class MetricsRecorder(logging.Handler):
    """Writes speculators' metric dicts as JSON lines and logs concise progress."""

    def __init__(self, path: str | None):
        super().__init__()
        self.path = path
        self.last_progress = 0.0
        self.epoch: int | None = None
        self.epoch_tokens = 0.0
        self.epoch_seconds = 0.0
        self.epoch_losses: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if not isinstance(msg, dict) or record.__dict__.get("hparams"):
            return
        if self.path:
            metrics.append(self.path, {"time": time.time(), **msg})
        if "train" in msg:
            self._on_step(msg)
        elif "val" in msg:
            self._on_val(msg)

    def _on_step(self, msg: dict) -> None:
        epoch = msg.get("epoch")
        if epoch != self.epoch:
            self.epoch, self.epoch_tokens, self.epoch_seconds, self.epoch_losses = epoch, 0.0, 0.0, []
            self.last_progress = 0.0
        profile = msg.get("profile") or {}
        step_s = profile.get("step_ms", 0.0) / 1000
        self.epoch_seconds += step_s
        self.epoch_tokens += profile.get("tokens_per_s", 0.0) * step_s
        loss = msg["train"].get("loss")
        if loss is not None:
            self.epoch_losses.append(float(loss))
        now = time.monotonic()
        if now - self.last_progress >= PROGRESS_EVERY_S:
            self.last_progress = now
            _progress(
                f"epoch {_human(epoch)} step {msg.get('global_step')}: loss {_fmt(loss)}, "
                f"{profile.get('tokens_per_s', 0.0):.0f} tokens/s "
                f"(epoch so far {_rate(self.epoch_tokens, self.epoch_seconds):.0f} tokens/s)"
            )

    def _on_val(self, msg: dict) -> None:
        epoch = msg.get("epoch")
        train_loss = sum(self.epoch_losses) / len(self.epoch_losses) if self.epoch_losses else None
        _progress(
            f"epoch {_human(epoch)} done: train loss {_fmt(train_loss)}, "
            f"val loss {_fmt(msg['val'].get('loss_epoch'))}, {self.epoch_tokens:.0f} tokens in "
            f"{self.epoch_seconds:.1f} s of steps = "
            f"{_rate(self.epoch_tokens, self.epoch_seconds):.0f} tokens/s"
        )


def install_metrics_recorder(path: str | None) -> None:
    """Attach the recorder after speculators configures its metric logger (which resets it)."""
    import speculators.train.cli as cli

    real_setup = cli.setup_metric_logger

    def setup_metric_logger(*args, **kwargs):
        real_setup(*args, **kwargs)
        if int(os.environ.get("RANK", "0")) == 0:
            logging.getLogger("speculators.metrics").addHandler(MetricsRecorder(path))

    cli.setup_metric_logger = setup_metric_logger


def main(argv: list[str] | None = None) -> None:
    import torch

    threads = os.environ.get("DRAFTLINE_TORCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if not has_accelerator():
        apply_cpu_shims()
    install_metrics_recorder(os.environ.get("DRAFTLINE_METRICS_PATH"))
    if os.environ.get("DRAFTLINE_HS_LOCK_TIMEOUT_S"):
        patch_lock_wait(float(os.environ["DRAFTLINE_HS_LOCK_TIMEOUT_S"]))
        patch_lock_wait_in_workers()

    from speculators.train.cli import main as speculators_main
    from speculators.train.config import TrainConfig

    speculators_main(TrainConfig.resolve(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
