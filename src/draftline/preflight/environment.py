"""The environment part (the GPU node, no engine): what the job sees (`node.probe`) against what
the run planned (EnvironmentPlan): the torch build against the planned device and the pinned
versions (`plan.check_job_environment`), the NVIDIA driver against the CUDA build of torch,
vLLM's import, the GPUs (or cores) against tensor x pipeline parallel, their free memory against
what vLLM takes at start, and the target's files (`target.read_target`)."""

from __future__ import annotations

import logging
import os
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftline.artifacts.preflight import Check, failed, not_run, passed, write_part
from draftline.planning import rule_params as plan
from draftline.preflight.common import one_line, skip_all
from draftline.preflight.node import Node, import_vllm, probe
from draftline.preflight.target import TargetFacts, read_target
from draftline.runtime.vllm_engine import VLLM_GPU_MEMORY_UTILIZATION, gpu_memory_share
from draftline.settings import DEFAULTS
from draftline.settings.target import vllm_ranks

log = logging.getLogger(__name__)

GIB = 1024**3
# The weights on one GPU must leave at least this share of vLLM's budget to the KV cache.
KV_CACHE_SHARE = 0.1
CUDA_13_DRIVER = "580"  # the first driver branch that supports CUDA 13.0 (NVIDIA's release notes)

# check names, as the report shows them
TORCH = "torch build and device"
VERSIONS = "package versions"
DRIVER = "CUDA driver"
GPUS, CORES = "GPUs visible", "CPU cores"
GPU_MEMORY, HOST_MEMORY = "GPU memory", "host memory"
TARGET = "target readable"
VLLM = "vLLM imports"


@dataclass(frozen=True)
class EnvironmentPlan:
    """What the run planned for its vLLM jobs (the params of the preflight rules)."""

    planned: dict  # device, dtype (rules/common.smk RESOLVED["engine"])
    versions: dict  # the pins of the packages the stages use
    setting: str = "auto"  # the config's `device`
    tensor_parallel_size: int = DEFAULTS.target.tensor_parallel_size
    pipeline_parallel_size: int = DEFAULTS.target.pipeline_parallel_size
    # the share of each GPU a generating engine takes (at start it stops when less is free:
    # vllm/v1/worker/utils.py); the check asks for it free
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    cpu_kv_cache_gib: int = DEFAULTS.vllm.cpu_kv_cache_gib

    @classmethod
    def for_engine(cls, engine, **plan) -> EnvironmentPlan:
        """The plan for jobs that load the target with `engine` (draftline.runtime.vllm_engine.EngineSettings)."""
        return cls(
            tensor_parallel_size=engine.tensor_parallel_size,
            pipeline_parallel_size=engine.pipeline_parallel_size,
            gpu_memory_utilization=gpu_memory_share(engine),
            cpu_kv_cache_gib=engine.cpu_kv_cache_gib,
            **plan,
        )

    @property
    def ranks(self) -> int:
        return vllm_ranks(self.tensor_parallel_size, self.pipeline_parallel_size)

    @property
    def device(self) -> str:
        return self.planned.get("device", "cpu")


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:2])


CUDA_12_GUIDANCE = (
    "update the driver to one that supports CUDA {build} (CUDA 13 needs driver {cuda13}+), or, on CUDA 12 "
    "drivers, install the CUDA 12 builds into the environment: torch {torch} from PyTorch's cu128 index "
    "(cu126 for older CUDA 12 drivers) and the vLLM {vllm} wheel built for the same CUDA (docs/gpu.md, "
    "'CUDA 12 drivers')"
)


def _driver_check(node: Node, env: EnvironmentPlan) -> Check:
    if env.device != "cuda":
        return not_run(DRIVER, "planned for cpu")
    if node.torch_cuda is None:
        return not_run(DRIVER, f"torch {node.torch_version} is a CPU build (see '{TORCH}')")
    guidance = CUDA_12_GUIDANCE.format(build=node.torch_cuda, cuda13=CUDA_13_DRIVER, torch=node.torch_version.split("+")[0],
                                       vllm=env.versions.get("vllm", "the pinned"))
    if node.driver_cuda is None:
        return failed(DRIVER, "no NVIDIA driver on this node (libcuda.so.1 does not load, no nvidia-smi): run the "
                              "GPU jobs on GPU nodes (the profile's partition)")
    build, driver = _version_tuple(node.torch_cuda), _version_tuple(node.driver_cuda)
    details = {"torch_cuda": node.torch_cuda, "driver_cuda": node.driver_cuda, "driver": node.driver_version}
    said = f"driver {node.driver_version or '?'} supports CUDA {node.driver_cuda}"
    if driver[:1] < build[:1]:
        return failed(DRIVER, f"torch {node.torch_version} is built for CUDA {node.torch_cuda} but this node's {said}: "
                              f"{guidance}", **details)
    note = " (an older minor version: CUDA's minor version compatibility covers it)" if driver < build else ""
    return passed(DRIVER, f"{said}; torch {node.torch_version} is built for CUDA {node.torch_cuda}{note}", **details)


def _torch_check(node: Node, env: EnvironmentPlan, driver: Check) -> Check:
    try:
        plan.check_job_environment(env.planned, None, env.setting)
    except plan.PlanError as error:
        reason = str(error)
        if driver.failed and env.device == "cuda" and node.torch_cuda is not None:
            reason += f" (the driver is older than this torch's CUDA: see '{DRIVER}')"
        return failed(TORCH, reason)
    build = f"CUDA {node.torch_cuda}" if node.torch_cuda else "CPU"
    return passed(TORCH, f"torch {node.torch_version} ({build} build) for device {env.device}")


def _versions_check(env: EnvironmentPlan) -> Check:
    try:
        plan.check_job_environment({}, env.versions)
    except plan.PlanError as error:
        return failed(VERSIONS, str(error))
    return passed(VERSIONS, ", ".join(f"{d} {v}" for d, v in sorted(env.versions.items())) + " as pinned")


def _devices_check(node: Node, env: EnvironmentPlan) -> Check:
    split = f"target.tensor_parallel_size x pipeline_parallel_size = {env.tensor_parallel_size} x {env.pipeline_parallel_size}"
    if env.device != "cuda":
        from draftline.runtime.vllm_engine import NotEnoughCores, cpu_bind_lists

        try:
            cpu_bind_lists(env.ranks, range(node.cores))
        except NotEnoughCores as error:
            return failed(CORES, str(error))
        return passed(CORES, f"{node.cores} core(s) for {env.ranks} vLLM CPU rank(s)")
    seen = len(node.gpus)
    where = f"CUDA_VISIBLE_DEVICES={node.visible}" if node.visible is not None else "CUDA_VISIBLE_DEVICES unset"
    if seen < env.ranks:
        why = f" ({node.claim_error})" if node.claim_error else ""
        return failed(GPUS, (
            f"this job sees {seen} GPU(s) ({where}){why} but {split} needs {env.ranks}: vLLM runs one rank per GPU. "
            f"The vLLM rules ask for gpu={env.ranks} themselves: give their partition nodes with {env.ranks} free GPUs "
            "(the profile's slurm_partition / gpu_model), set nothing else that narrows CUDA_VISIBLE_DEVICES, or "
            "lower the parallel sizes if the target fits fewer GPUs"
        ), seen=seen, needed=env.ranks)
    return passed(GPUS, f"{seen} GPU(s) ({where}) for {split}", seen=seen, needed=env.ranks)


def _memory_check(node: Node, env: EnvironmentPlan, target: TargetFacts | None) -> Check:
    dtype = env.planned.get("dtype", "bfloat16")
    weights = target.weights_bytes(dtype) if target else None
    if env.device != "cuda":
        if node.host_available is None:
            return not_run(HOST_MEMORY, "this node does not say its available memory (/proc/meminfo)")
        kv = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", env.cpu_kv_cache_gib)) * GIB * env.ranks
        need = (weights or 0) + kv
        said = (f"{node.host_available / GIB:.1f} GiB available; the target in {dtype} takes "
                f"{(weights or 0) / 1e9:.2f} GB plus {kv / GIB:.0f} GiB of KV cache (VLLM_CPU_KVCACHE_SPACE)")
        if node.host_available < need:
            return failed(HOST_MEMORY, f"{said}: run on a node with more memory (the profile's mem_mb)")
        return passed(HOST_MEMORY, said)
    if not node.gpus:
        return not_run(GPU_MEMORY, f"no GPU visible (see '{GPUS}')")
    util = env.gpu_memory_utilization
    for i, (free, total) in enumerate(node.gpus):
        if free < util * total:
            return failed(GPU_MEMORY, (
                f"GPU {i} of this job has {free / GIB:.1f} of {total / GIB:.1f} GiB free, but vLLM takes "
                f"gpu_memory_utilization {util} of each GPU ({util * total / GIB:.1f} GiB) when it starts and stops "
                "with less: another process holds memory on it (nvidia-smi lists it); run where the job's GPUs "
                "are its own (a whole-GPU partition, or Slurm's --exclusive)"
            ), free_gib=[round(f / GIB, 1) for f, _ in node.gpus])
    usable = min(util * total for _, total in node.gpus)
    details = {"free_gib": [round(f / GIB, 1) for f, _ in node.gpus], "usable_gib_per_gpu": round(usable / GIB, 1)}
    if weights is None:
        return passed(GPU_MEMORY, f"{len(node.gpus)} GPU(s) with at least {usable / GIB:.1f} GiB for vLLM each "
                                  "(the target's size is unknown: see 'target readable')", **details)
    per_gpu = weights / env.ranks
    details["weights_gb_per_gpu"] = round(per_gpu / 1e9, 2)
    if per_gpu > (1 - KV_CACHE_SHARE) * usable:
        return failed(GPU_MEMORY, (
            f"the target's weights in {dtype} are {weights / 1e9:.1f} GB, {per_gpu / 1e9:.1f} GB on each of "
            f"{env.ranks} GPU(s), which leaves under {KV_CACHE_SHARE:.0%} of the {usable / GIB:.1f} GiB vLLM may use "
            "per GPU to the KV cache: raise target.tensor_parallel_size (docs/cluster.md, 'Sizing the target')"
        ), **details)
    return passed(GPU_MEMORY, (
        f"{len(node.gpus)} GPU(s), {usable / GIB:.1f} GiB for vLLM on each; the weights take "
        f"{per_gpu / 1e9:.1f} GB per GPU in {dtype}"
    ), **details)


def _vllm_check(vllm: str | BaseException, node: Node, env: EnvironmentPlan) -> Check:
    if isinstance(vllm, str):
        return passed(VLLM, f"vLLM {vllm}" + (" with its CUDA kernels" if env.device == "cuda" else ""))
    return failed(VLLM, (
        f"{one_line(vllm, 400)}: a vLLM wheel runs with the torch build it was compiled against; this "
        f"environment has torch {node.torch_version}: install the vLLM {env.versions.get('vllm', '')} wheel built for "
        "this torch's CUDA, or rebuild the environment from requirements/ (docs/gpu.md, 'CUDA 12 drivers')"
    ))


def environment_checks(node: Node, env: EnvironmentPlan, target: TargetFacts | BaseException,
                       vllm: str | BaseException | None = None) -> list[Check]:
    """The environment part's checks, from what the job saw (`node`), what the run planned
    (`env`), the target folder (its facts, or the error reading it) and vLLM's import (its
    version, or the error; None: not tried)."""
    facts = target if isinstance(target, TargetFacts) else None
    if facts is not None:
        target_check = passed(TARGET, (
            f"{facts.folder}: {facts.num_hidden_layers} layers, hidden {facts.hidden_size}, "
            f"{facts.weight_files} safetensors file(s) complete, {facts.float_parameters / 1e9:.2f}B parameters"
            + ("" if facts.chat_template else "; no chat template in the tokenizer (set target.chat_template)")
        ), parameters=facts.float_parameters)
        if not facts.chat_template:
            target_check = failed(TARGET, target_check.reason)
    else:
        target_check = failed(TARGET, one_line(target))
    driver = _driver_check(node, env)
    checks = [
        _torch_check(node, env, driver),
        _versions_check(env),
        driver,
        _devices_check(node, env),
        _memory_check(node, env, facts),
        target_check,
    ]
    return checks if vllm is None else [*checks[:3], _vllm_check(vllm, node, env), *checks[3:]]


def _tried(step: Callable, what: str):
    """`step()`, or the exception it raised (logged with its traceback): an input to the checks."""
    try:
        return step()
    except Exception as error:  # noqa: BLE001 - reported as a check's reason
        log.error("%s failed:\n%s", what, traceback.format_exc())
        return error


def run_environment(target_dir: str | Path, out_dir: str | Path, env: EnvironmentPlan, *, claim_error: str | None = None,
                    trust_remote_code: bool = False) -> dict:
    """The environment part: probe this node, import vLLM, read the target, write the checks."""
    started = time.monotonic()
    node = _tried(lambda: probe(claim_error), "probing the node (torch, CUDA)")
    if isinstance(node, BaseException):  # torch itself does not import or start: nothing else can run
        checks = [failed(TORCH, f"{one_line(node)}: rebuild the environment (DRAFTLINE_ENV=gpu ./draftline true, "
                                "docs/gpu.md)")]
        devices, memory = (GPUS, GPU_MEMORY) if env.device == "cuda" else (CORES, HOST_MEMORY)
        checks += skip_all([VERSIONS, DRIVER, VLLM, devices, memory, TARGET], f"'{TORCH}' failed")
        return write_part(out_dir, "environment", checks)
    log.info("node: %s", node)
    vllm = _tried(lambda: import_vllm(env.device), "importing vLLM")
    target = _tried(lambda: read_target(target_dir, trust_remote_code), "reading the target")
    checks = environment_checks(node, env, target, vllm)
    for c in checks:
        log.info("%s: %s: %s", c.name, c.status, c.reason)
    return write_part(out_dir, "environment", checks, {"environment_seconds": round(time.monotonic() - started, 1)})
