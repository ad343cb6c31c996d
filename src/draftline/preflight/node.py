"""What a preflight job sees of its machine (`probe`: torch's build and GPUs, the NVIDIA driver,
cores, memory; `import_vllm`), read without starting an engine; the environment part checks it
against the plan."""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from draftline.planning import rule_params as plan
from draftline.runtime import nvidia
from draftline.runtime.nvidia import cuda_version


@dataclass(frozen=True)
class Node:
    """What a preflight job sees of its machine (`probe`); tests build it by hand."""

    torch_version: str
    torch_cuda: str | None  # the CUDA version torch was built for (torch.version.cuda); None: a CPU build
    cuda_available: bool
    driver_cuda: str | None = None  # the newest CUDA the NVIDIA driver supports; None: no driver found
    driver_version: str | None = None
    gpus: tuple[tuple[int, int], ...] = ()  # (free, total) bytes of each GPU the job sees
    visible: str | None = None  # CUDA_VISIBLE_DEVICES
    cores: int = 1
    host_available: int | None = None  # bytes (MemAvailable)
    claim_error: str | None = None  # devices.claim_gpus refused the job's GPUs


def module_version(text: str) -> str | None:
    """The driver's version in /proc/driver/nvidia/version ("... Kernel Module  550.54.15 ...",
    the open modules "... Open Kernel Module for x86_64  580.159.04 ...")."""
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return found[1] if found else None


def driver_versions() -> tuple[str | None, str | None]:
    """(the CUDA version the NVIDIA driver supports, the driver's version) without starting
    CUDA: libcuda's cuDriverGetVersion and the kernel module's version, else NVML's (nvidia-smi's
    header where nvidia-ml-py is not installed; the same answers on an H200 node:
    benchmarks/cuda/results/h200_preflight_probe.md)."""
    cuda = driver = None
    try:
        value = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(value)) == 0 and value.value:
            cuda = cuda_version(value.value)
    except (OSError, AttributeError):
        pass
    module = Path("/proc/driver/nvidia/version")
    if module.is_file():
        driver = module_version(module.read_text())
    if cuda is None or driver is None:
        asked_cuda, asked_driver = nvidia.driver_versions()
        cuda, driver = cuda or asked_cuda, driver or asked_driver
    return cuda, driver


def _host_available() -> int | None:
    try:
        return psutil.virtual_memory().available  # Linux: MemAvailable
    except OSError:
        return None


def probe(claim_error: str | None = None) -> Node:
    """This job's machine, after it claimed its GPUs (CUDA starts here, in this process only)."""
    import torch

    version, _, has_cuda = plan.torch_build()
    gpus = []
    if has_cuda:
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            gpus.append((int(free), int(total)))
    driver_cuda, driver_version = driver_versions()
    return Node(
        torch_version=version, torch_cuda=torch.version.cuda, cuda_available=has_cuda, driver_cuda=driver_cuda,
        driver_version=driver_version, gpus=tuple(gpus), visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        cores=len(os.sched_getaffinity(0)), host_available=_host_available(), claim_error=claim_error,
    )




def import_vllm(device: str) -> str:
    """vLLM's version once it imported with its compiled ops (on CUDA `vllm._C`, or
    `vllm._C_stable_libtorch` from vLLM 0.26 on, which fail when
    the wheel was built against another torch build than the one installed); raises otherwise."""
    import vllm
    from vllm import LLM  # noqa: F401 - the engine class every stage builds

    if device == "cuda":
        import importlib

        try:  # the two vLLM versions the GPU locks offer name the module differently
            importlib.import_module("vllm._C")
        except ModuleNotFoundError:
            importlib.import_module("vllm._C_stable_libtorch")
    return vllm.__version__
