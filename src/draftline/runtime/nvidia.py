"""The NVIDIA driver's answers without starting CUDA (`gpu_count`, `driver_versions`): NVML
through nvidia-ml-py (`pynvml`) where it is installed (the GPU locks have it), else nvidia-smi's
output (the CPU environment has no nvidia-ml-py; nvidia-smi is absent on a machine without GPUs).
On an H100 node (nvidia-ml-py 13.610.43, driver 580.159.04) NVML answered what libcuda, the
kernel module and nvidia-smi did: CUDA 13.0, 580.159.04, 1 GPU."""

from __future__ import annotations

import re
import shutil
import subprocess


def cuda_version(value: int) -> str:
    """cuDriverGetVersion's number as a version: 12040 -> "12.4"."""
    return f"{value // 1000}.{value % 1000 // 10}"


_NOT_INSTALLED = object()


def _ask_nvml(question):
    """`question(pynvml)` with NVML started; None where the driver does not answer, _NOT_INSTALLED
    where nvidia-ml-py is not."""
    try:
        import pynvml
    except ImportError:
        return _NOT_INSTALLED
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return question(pynvml)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _smi(*args: str) -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def gpu_count() -> int:
    """How many GPUs the driver lists (0 where none answers)."""
    count = _ask_nvml(lambda nvml: nvml.nvmlDeviceGetCount())
    if count is _NOT_INSTALLED:
        return sum(1 for line in _smi("-L").splitlines() if line.startswith("GPU "))
    return count or 0


def driver_versions() -> tuple[str | None, str | None]:
    """(the newest CUDA the driver supports, the driver's version); None where none answers."""
    versions = _ask_nvml(lambda nvml: (cuda_version(nvml.nvmlSystemGetCudaDriverVersion()),
                                       nvml.nvmlSystemGetDriverVersion()))
    if versions is _NOT_INSTALLED:
        out = _smi()
        cuda = re.search(r"CUDA Version:\s*([\d.]+)", out)
        driver = re.search(r"Driver Version:\s*([\d.]+)", out)
        return cuda[1] if cuda else None, driver[1] if driver else None
    return versions or (None, None)
