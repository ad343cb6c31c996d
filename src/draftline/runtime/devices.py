"""Which GPUs a job may use: Slurm's allocation on a cluster, a locked slot locally.

Snakemake's `gpu` resource is only a scheduler token: locally it never sets
CUDA_VISIBLE_DEVICES, so two concurrent GPU jobs would both land on device 0. A GPU job
calls `claim_gpus(snakemake.resources.get("gpu", 0))` before vLLM/torch touches CUDA:

- inside a Slurm job that was given exactly what it asked for (the Slurm profile), the
  devices Slurm set in CUDA_VISIBLE_DEVICES are kept;
- otherwise (a local run, or local jobs inside a bigger `salloc`), the job takes `count`
  free devices out of the visible ones, each held by an exclusive `flock` on
  `<lock dir>/gpu<id>.lock` until the process exits (a killed job frees its devices), and
  waits while all are taken (when `--resources gpu=N` is larger than the machine).

Faking a GPU count (tests, or to cap the pool): DRAFTLINE_GPU_COUNT=n. The lock folder
(shared by every draftline job on the machine) is DRAFTLINE_GPU_LOCK_DIR, default
/tmp/draftline-gpu-locks.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from filelock import lock_descriptor

from draftline.runtime import nvidia

log = logging.getLogger(__name__)

COUNT_ENV = "DRAFTLINE_GPU_COUNT"
LOCK_DIR_ENV = "DRAFTLINE_GPU_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/draftline-gpu-locks"

# Open lock files of the devices this process holds: flock is released when they close,
# i.e. when the process exits, however it exits.
_held: list[int] = []


class GpuClaimError(RuntimeError):
    pass


def visible_gpus() -> list[str]:
    """Device ids this process may use: CUDA_VISIBLE_DEVICES if set, else all on the machine."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip() not in ("", "NoDevFiles"):
        return [d.strip() for d in env.split(",") if d.strip()]
    fake = os.environ.get(COUNT_ENV)
    if fake is not None:
        try:
            return [str(i) for i in range(int(fake))]
        except ValueError:
            raise GpuClaimError(f"{COUNT_ENV}={fake!r}: expected a whole number of GPUs") from None
    return [str(i) for i in range(_machine_gpu_count())]


def _machine_gpu_count() -> int:
    # Without initialising CUDA here: the device mask must be set before the first CUDA call.
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return sum(1 for _ in proc.iterdir())
    return nvidia.gpu_count()


def _lock_dir() -> Path:
    base = Path(os.environ.get(LOCK_DIR_ENV, DEFAULT_LOCK_DIR))
    job = os.environ.get("SLURM_JOB_ID")
    # Device ids inside a Slurm allocation are relative to it: one lock namespace per job.
    path = base / f"slurm-{job}" if job else base
    path.mkdir(parents=True, exist_ok=True)
    try:
        base.chmod(0o1777)  # several users may share the GPUs of one machine
    except PermissionError:
        pass
    return path


def _try_lock(path: Path) -> int | None:
    # filelock's lock on a descriptor of our own, not its FileLock: that one opens the file for
    # writing (another user's lock file here is read-only to us), refuses a file a third user made
    # in this sticky folder, and closes the descriptor in a forked child, where vLLM's forked
    # workers keep holding the device until they exit.
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    if not lock_descriptor(fd, blocking=False):
        os.close(fd)
        return None
    return fd


def claim_gpus(count: int, *, poll_s: float = 2.0, timeout_s: float | None = None) -> list[str]:
    """Restrict this process (and what it spawns) to `count` devices; return their ids.

    Sets CUDA_VISIBLE_DEVICES. Returns [] (and changes nothing) for count 0 or on a machine
    without GPUs, so CPU runs are unaffected.
    """
    count = int(count or 0)
    if count <= 0:
        return []
    pool = visible_gpus()
    job = os.environ.get("SLURM_JOB_ID")
    if job and len(pool) <= count:
        log.info("Slurm job %s: CUDA_VISIBLE_DEVICES=%s (set by Slurm)",
                 job, os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
        return pool
    if not pool:
        log.info("the job asks for %d GPU(s) but none is visible here: running without", count)
        return []
    if count > len(pool):
        raise GpuClaimError(
            f"the job asks for {count} GPUs but only {len(pool)} are visible ({','.join(pool)}): "
            "lower the rule's `gpu` resource (--set-resources RULE:gpu=N) or run it on a bigger node"
        )

    lock_dir = _lock_dir()
    start = time.monotonic()
    last_note = start
    while True:
        taken: list[tuple[str, int]] = []
        for device in pool:
            fd = _try_lock(lock_dir / f"gpu{device}.lock")
            if fd is not None:
                taken.append((device, fd))
                if len(taken) == count:
                    break
        if len(taken) == count:
            break
        # Never hold some while waiting for more: two jobs could each wait on the other.
        for _, fd in taken:
            os.close(fd)
        waited = time.monotonic() - start
        if timeout_s is not None and waited >= timeout_s:
            raise GpuClaimError(
                f"no {count} free GPU(s) among {','.join(pool)} after {waited:.0f} s "
                f"(locks in {lock_dir}): other jobs hold them"
            )
        if time.monotonic() - last_note >= 60:
            log.info("waiting for %d free GPU(s) among %s (%.0f s so far)", count, ",".join(pool), waited)
            last_note = time.monotonic()
        time.sleep(poll_s)

    devices = [d for d, _ in taken]
    _held.extend(fd for _, fd in taken)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    log.info("local GPU slot: CUDA_VISIBLE_DEVICES=%s (of %s; locks in %s)",
             os.environ["CUDA_VISIBLE_DEVICES"], ",".join(pool), lock_dir)
    return devices


def release_gpus() -> None:
    """Give back the devices this process claimed (process exit does the same)."""
    while _held:
        os.close(_held.pop())
