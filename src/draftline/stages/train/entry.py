"""speculators' own training entry point, plus CPU shims and a metrics log.

    python -m draftline.stages.train.entry <speculators train flags>            # CPU or 1 GPU
    torchrun --nproc_per_node N -m draftline.stages.train.entry <flags>         # N GPUs

It runs exactly what `python -m speculators.train` runs (`cli.main(TrainConfig.resolve())`),
after these narrow additions, each attribute it replaces named with why in
`speculators_patches.PATCHES` (and replaced through its `replace`):
- CPU shims, only when no accelerator exists: speculators 0.9.0 assumes one (its Trainer's
  device, its step timer's synchronize, its checkpointer's device for a resume).
- torch intra-op threads = $DRAFTLINE_TORCH_THREADS (the job's threads).
- online hidden states ($DRAFTLINE_HS_LOCK_TIMEOUT_S set): hs_connectors' `wait_for_lock`, which
  the file transfer calls before reading each sample the server wrote, waits that long instead
  of its fixed 10 s ("Timed out waiting for lock": the sample was then recomputed).
- every metrics record speculators logs (per step: loss, tokens/s; per epoch: val loss) is
  appended as one JSON line to $DRAFTLINE_METRICS_PATH (rank 0), and summarised as
  progress lines on stdout (`step N/M`, epochs counted from 1, the time left); speculators'
  own console copy of each record (five lines a step) is switched off: the records are in
  metrics.jsonl, the resolved settings in run.yaml.
- a second SIGTERM (Slurm signals every process of a job, and draftline's job process forwards
  its own) neither deadlocks speculators' signal handler nor cuts its interrupt save; SIGKILL
  still ends it.
- samples the Trainer skips are counted (`install_skip_counter`): with `--on-missing generate`,
  a sample whose hidden states the server did not give after speculators' retries becomes a
  `SampleUnavailable` that its collator drops from the batch, counting it in the batch's
  `error_records`, and the Trainer only logs a warning. Every batch passes through
  `BatchRecoveryCoordinator.consume` (training and validation) before it is used: there each
  batch's `error_records` is appended to $DRAFTLINE_METRICS_PATH as a `skipped_samples` record
  (every rank, with its epoch and phase), which draftline.stages.train sums and checks against
  `hidden_states.online_max_skipped_samples` before publishing.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from draftline.artifacts import metrics
from draftline.stages.train.speculators_patches import replace

PROGRESS_EVERY_S = 10.0


def has_accelerator() -> bool:
    import torch

    return torch.accelerator.current_accelerator(check_available=True) is not None


def apply_cpu_shims() -> None:
    """Let speculators' Trainer run on the CPU (no-ops where an accelerator exists)."""
    import torch

    replace("speculators.train.trainer:get_local_rank", lambda: "cpu")
    replace("speculators.train.checkpointer:get_current_device", lambda: "cpu")

    def synchronize(device=None):
        if torch.accelerator.current_accelerator(check_available=True) is None:
            return None
        return real_synchronize(device)

    real_synchronize = replace("torch:accelerator.synchronize", synchronize)


def patch_lock_wait(timeout_s: float) -> None:
    """Wait up to `timeout_s` for each sample's write lock (see the module docstring)."""

    def wait_for_lock(lock_path, timeout=10.0, poll_interval=0.1):
        return real(lock_path, timeout=max(float(timeout), timeout_s), poll_interval=poll_interval)

    real = replace("hs_connectors.transfer:wait_for_lock", wait_for_lock)


def _worker_init(worker_id: int) -> None:
    """speculators' loader-worker init, then the lock wait (a spawned worker imports afresh)."""
    import speculators.train.dataloader as dataloader

    dataloader._worker_init_fn(worker_id)  # in the worker: speculators' own (unpatched import)
    patch_lock_wait(float(os.environ["DRAFTLINE_HS_LOCK_TIMEOUT_S"]))


def patch_lock_wait_in_workers() -> None:
    """The loader's workers are spawned: they get the patch through their init function."""
    replace("speculators.train.dataloader:_worker_init_fn", _worker_init)


def _progress(line: str) -> None:
    # Plain lines (not speculators' rich console) so the step's log stays greppable.
    print(f"[draftline] {line}", flush=True)


def _human(epoch) -> str:
    return str(epoch + 1) if isinstance(epoch, int) else str(epoch)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{float(value):.4f}"


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0


def _left(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


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
        # set by the Trainer wrapper (install_step_counts): optimizer steps per epoch, epochs
        self.steps_per_epoch: int | None = None
        self.epochs: int | None = None
        self.first_step: tuple[int, float] | None = None  # (global step, time) of this process's first
        self.current_epoch: int | None = None  # the epoch under way (0-based, speculators' own)

    def where(self, global_step: int, now: float) -> str:
        """`step N/M (epoch e/E), about H:MM:SS left`: steps counted from 1, the time left from
        this process's own steps (a resumed run does not count the steps it skipped)."""
        step = global_step + 1
        if not self.steps_per_epoch or not self.epochs:
            return f"step {step}"
        total = self.steps_per_epoch * self.epochs
        text = f"step {step}/{total} (epoch {global_step // self.steps_per_epoch + 1}/{self.epochs})"
        if self.first_step is None:
            self.first_step = (global_step, now)
        first, started = self.first_step
        if global_step > first:
            text += f", about {_left((now - started) / (global_step - first) * (total - step))} left"
        return text

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
        where = self.where(int(msg.get("global_step", 0)), now)
        if now - self.last_progress >= PROGRESS_EVERY_S:
            self.last_progress = now
            _progress(
                f"{where}: loss {_fmt(loss)}, {profile.get('tokens_per_s', 0.0):.0f} tokens/s "
                f"(epoch {_human(epoch)} so far {_rate(self.epoch_tokens, self.epoch_seconds):.0f} tokens/s)"
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


def install_metrics_recorder(path: str | None) -> MetricsRecorder:
    """Attach the recorder after speculators configures its metric logger (which resets it), and
    keep the records off the console (they stay in metrics.jsonl and speculators' own loggers)."""
    recorder = MetricsRecorder(path)

    def setup_metric_logger(*args, **kwargs):
        real_setup(*args, **kwargs)
        metric_logger = logging.getLogger("speculators.metrics")
        metric_logger.propagate = False  # the root's console handler printed five lines a step
        if int(os.environ.get("RANK", "0")) == 0:
            metric_logger.addHandler(recorder)

    real_setup = replace("speculators.train.cli:setup_metric_logger", setup_metric_logger)
    return recorder


def install_step_counts(recorder: MetricsRecorder) -> None:
    """Tell the recorder the steps per epoch, the epochs and the epoch under way, from the Trainer
    speculators builds (a subclass that only reads them before running its own loops)."""
    import speculators.train.cli as cli

    class Trainer(cli.Trainer):
        def run_training(self):
            recorder.steps_per_epoch = len(self.train_loader)
            recorder.epochs = self.config.num_epochs
            return super().run_training()

        def train_epoch(self, epoch, *args, **kwargs):
            recorder.current_epoch = epoch
            return super().train_epoch(epoch, *args, **kwargs)

        def val_epoch(self, epoch, *args, **kwargs):
            recorder.current_epoch = epoch
            return super().val_epoch(epoch, *args, **kwargs)

    replace("speculators.train.cli:Trainer", Trainer)


SKIPPED_KEY = "error_records"  # the collator's count of the samples it dropped from a batch


def install_skip_counter(recorder: MetricsRecorder) -> None:
    """Count the samples speculators' collator dropped from each batch (see the module docstring):
    a wrapper of `BatchRecoveryCoordinator.consume`, the one call every training and validation
    batch makes before it is used, which reads the batch's `error_records` and then runs
    speculators' own consume unchanged."""
    rank = int(os.environ.get("RANK", "0"))
    seen = {"training": 0, "validation": 0}

    def consume(self, batch, *args, **kwargs):
        if SKIPPED_KEY not in batch:
            raise RuntimeError(
                f"speculators' {self.phase} batch has no {SKIPPED_KEY!r} (keys {sorted(batch)}): draftline cannot "
                "count skipped samples with this speculators version (draftline.stages.train.entry.install_skip_counter)"
            )
        skipped = int(batch[SKIPPED_KEY])
        if skipped:
            seen[self.phase] = seen.get(self.phase, 0) + skipped
            epoch = recorder.current_epoch
            if recorder.path:
                metrics.append(recorder.path, {"time": time.time(), "skipped_samples": skipped, "phase": self.phase,
                                               "epoch": epoch, "rank": rank})
            _progress(
                f"{self.phase} epoch {_human(epoch)}: speculators dropped {skipped} sample(s) from a batch on rank "
                f"{rank}, without their hidden states (its warning above says why); {seen[self.phase]} in "
                f"{self.phase} so far"
            )
        return real_consume(self, batch, *args, **kwargs)

    real_consume = replace("speculators.train.recovery:BatchRecoveryCoordinator.consume", consume)


def ignore_repeated_sigterm() -> None:
    """A second SIGTERM (Slurm's to every process plus draftline's forward) must neither hang nor
    cut the interrupt save. speculators' handler takes a plain Lock: a second signal arriving
    while the first handler holds it (it logs under the lock) re-enters on the same thread and
    waits forever (seen here: the Trainer hung in a futex after two SIGTERMs 30 ms apart). An
    RLock lets the nested call see `_interrupted` and return. And speculators restores the
    default SIGTERM action before saving, so a later SIGTERM would kill the save: ignored."""
    import signal
    import threading

    def __init__(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._lock = threading.RLock()

    def restore(self):
        real_restore(self)
        if self._interrupted:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    real_init = replace("speculators.train.graceful_shutdown:GracefulShutdownHandler.__init__", __init__)
    real_restore = replace("speculators.train.graceful_shutdown:GracefulShutdownHandler.restore", restore)


def quiet_cpu_warnings() -> None:
    """Warnings torch repeats on every CPU run that no setting can change."""
    import warnings

    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")
    warnings.filterwarnings("ignore", message=".*CUDA is not available or torch_xla is imported. Disabling autocast")


def main(argv: list[str] | None = None) -> None:
    import torch

    threads = os.environ.get("DRAFTLINE_TORCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if not has_accelerator():
        apply_cpu_shims()
        quiet_cpu_warnings()
    recorder = install_metrics_recorder(os.environ.get("DRAFTLINE_METRICS_PATH"))
    install_step_counts(recorder)
    install_skip_counter(recorder)
    ignore_repeated_sigterm()
    if os.environ.get("DRAFTLINE_HS_LOCK_TIMEOUT_S"):
        patch_lock_wait(float(os.environ["DRAFTLINE_HS_LOCK_TIMEOUT_S"]))
        patch_lock_wait_in_workers()

    from speculators.train.cli import main as speculators_main
    from speculators.train.config import TrainConfig

    speculators_main(TrainConfig.resolve(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
