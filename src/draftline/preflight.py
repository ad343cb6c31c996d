"""Preflight: the run's first minutes on its cluster, before hours of GPU time are spent.

`snakemake ... preflight` runs, in jobs with the run's own GPU count and engine settings
(rules/preflight.smk), one part per job; each writes its checks (`artifacts.preflight`) and
never fails by itself, so the report names every problem at once:

- `environment` (the GPU node, no engine): the torch build against the planned device and the
  pinned versions (`plan.check_job_environment`), the NVIDIA driver against the CUDA build of
  torch, the GPUs this job sees against tensor x pipeline parallel, their free memory against
  what vLLM takes at start, and the target's files (config, tokenizer, every safetensors file
  complete);
- `regenerate` (one engine): the target loads in vLLM with the run's settings; the first
  `preflight.prompts` prompts of the run's prompt file are answered by the regeneration stage's
  own code (`regenerate.regenerate`), the first `preflight.rows` of them decoded greedily as
  evaluation does (the reference for the lossless check) and tokenized by the tokenization
  stage's own code (`tokenization.tokenize`);
- `hidden_states` (one engine): those rows extracted by the extraction stage's own code
  (`hidden_states.extract_shard`: the configured backend, connector, layers, format and parallel
  split, every file validated), then the hidden-state fidelity check (`fidelity_check`);
- `speculative` (one engine): an untrained draft of the run's speculator config (evaluation's
  `make_untrained_draft`, vocab maps by the vocab stage's own code) served in vLLM's speculative
  decoding; its greedy outputs must equal the target's own token for token.

A part whose inputs failed records its checks as `not run`, naming what failed. Each part also
records what it measured: load seconds and tokens per second, which the plan's sizing uses in
place of its assumed rates (draftline.planning.sizing).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import re
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.artifacts.preflight import Check, failed, not_run, part_failures, passed, read_part, write_part
from draftline.fidelity import FidelitySettings
from draftline.planning import rule_params as plan
from draftline.planning.config_schema import default
from draftline.runtime.atomic import atomic_file
from draftline.runtime.shards import ShardJob
from draftline.runtime.vllm_engine import VLLM_GPU_MEMORY_UTILIZATION, gpu_memory_share

log = logging.getLogger(__name__)

GIB = 1024**3
# The weights on one GPU must leave at least this share of vLLM's budget to the KV cache.
KV_CACHE_SHARE = 0.1
CUDA_13_DRIVER = "580"  # the first driver branch that supports CUDA 13.0 (NVIDIA's release notes)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}  # safetensors dtypes vLLM casts to the engine dtype

# check names, as the report shows them
TORCH = "torch build and device"
VERSIONS = "package versions"
DRIVER = "CUDA driver"
GPUS, CORES = "GPUs visible", "CPU cores"
GPU_MEMORY, HOST_MEMORY = "GPU memory", "host memory"
TARGET = "target readable"
VLLM = "vLLM imports"
LOAD = "target loads in vLLM"
REGENERATION = "regeneration"
REFERENCE = "greedy decoding"
TOKENIZATION = "tokenization"
EXTRACTION = "hidden-state extraction"
FIDELITY = "hidden-state fidelity"
DRAFT = "untrained draft"
LOSSLESS = "speculative decoding is lossless"


@dataclass(frozen=True)
class PreflightSettings:
    """The `preflight:` config block."""

    prompts: int = default("preflight", "prompts")  # answered by regeneration (its rate)
    rows: int = default("preflight", "rows")  # of those: extracted, decoded with the draft


@dataclass(frozen=True)
class Part:
    """Where one preflight part works: the target it loads, the folder of the part it follows
    (whose checks decide what this one can run), its own folder, and the log its errors point to."""

    target_dir: str | Path
    upstream_dir: str | Path
    out_dir: str | Path
    log_hint: str = "the job's log"


@dataclass(frozen=True)
class RegenerationStages:
    """The run's own settings of the stages the regeneration part goes through."""

    regenerate: object  # RegenerateSettings
    evaluate: object  # EvaluateSettings
    tokenize: object  # TokenizeSettings
    enabled: bool = True  # regenerate.enabled: false trains the dataset's answers


def _one_line(error: BaseException, limit: int = 700) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _attempt(name: str, step: Callable[[], Check], log_hint: str) -> Check:
    """`step()`'s check, or a failed one naming the error (its traceback goes to the job's log)."""
    try:
        return step()
    except Exception as error:  # noqa: BLE001 - any failure is this check's result, reported
        log.error("%s failed:\n%s", name, traceback.format_exc())
        return failed(name, f"{_one_line(error)} (traceback in {log_hint})")


def _upstream(folder: str | Path, part: str) -> list[str]:
    """The failed or not-run checks of an earlier part this one needs, as 'part: name' strings."""
    record = read_part(folder)
    return [f"{part}: {c.name}" for c in record["checks"] if c.failed]


def _skip_all(names: list[str], why: str) -> list[Check]:
    return [not_run(name, why) for name in names]


# ---------------------------------------------------------------- environment


@dataclass(frozen=True)
class EnvironmentPlan:
    """What the run planned for its vLLM jobs (the params of the preflight rules)."""

    planned: dict  # device, dtype (rules/common.smk RESOLVED["engine"])
    versions: dict  # the pins of the packages the stages use
    setting: str = "auto"  # the config's `device`
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # the share of each GPU a generating engine takes (at start it stops when less is free:
    # vllm/v1/worker/utils.py); the check asks for it free
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    cpu_kv_cache_gib: int = default("vllm", "cpu_kv_cache_gib")

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
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def device(self) -> str:
        return self.planned.get("device", "cpu")


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


def cuda_version(value: int) -> str:
    """cuDriverGetVersion's number as a version: 12040 -> "12.4"."""
    return f"{value // 1000}.{value % 1000 // 10}"


def module_version(text: str) -> str | None:
    """The driver's version in /proc/driver/nvidia/version ("... Kernel Module  550.54.15 ...",
    the open modules "... Open Kernel Module for x86_64  580.159.04 ...")."""
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return found[1] if found else None


def driver_versions() -> tuple[str | None, str | None]:
    """(the CUDA version the NVIDIA driver supports, the driver's version) without starting
    CUDA: libcuda's cuDriverGetVersion and the kernel module's version, else nvidia-smi's header
    (the same answers on an H200 node: benchmarks/cuda/results/h200_preflight_probe.md)."""
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
    if (cuda is None or driver is None) and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        cuda = cuda or (m[1] if (m := re.search(r"CUDA Version:\s*([\d.]+)", out)) else None)
        driver = driver or (m[1] if (m := re.search(r"Driver Version:\s*([\d.]+)", out)) else None)
    return cuda, driver


def _host_available() -> int | None:
    try:
        found = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return int(found[1]) * 1024 if found else None


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


@dataclass(frozen=True)
class TargetFacts:
    """What the environment check reads of the target folder without loading weights."""

    folder: str
    hidden_size: int
    num_hidden_layers: int
    weight_files: int
    float_parameters: int  # in floating-point tensors (vLLM casts them to the engine dtype)
    other_bytes: int  # quantized tensors, kept as stored
    chat_template: bool

    def weights_bytes(self, dtype: str) -> int:
        return self.float_parameters * DTYPE_BYTES.get(dtype, 2) + self.other_bytes


class TargetUnreadable(ValueError):
    """The target folder cannot be read as the stages will read it."""


def _safetensors_header(path: Path) -> dict:
    """A safetensors file's header, checked against the file's size (a partial download or copy
    is shorter than its header says)."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        if not 0 < size < 100 * 1024**2:
            raise TargetUnreadable(f"{path}: not a safetensors file (header size {size}); fetch it again")
        header = json.loads(handle.read(size))
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((t["data_offsets"][1] for t in tensors.values()), default=0)
    actual = path.stat().st_size
    if actual < 8 + size + end:
        raise TargetUnreadable(
            f"{path}: {actual:,} bytes, but its header lists {8 + size + end:,}: a partial download or copy; "
            "fetch the target again (hf download <id> --revision <commit>)"
        )
    return tensors


def read_target(target_dir: str | Path, trust_remote_code: bool = False) -> TargetFacts:
    """The target folder as the stages read it: config (speculators' reader), tokenizer with a
    chat template, and every safetensors file (the index's too) complete; raises TargetUnreadable."""
    from transformers import AutoTokenizer

    from draftline.artifacts.target import dims

    folder = Path(target_dir)
    if not (folder / "config.json").is_file():
        raise TargetUnreadable(f"{folder}/config.json: missing or unreadable from this node (is the folder on a "
                               "filesystem the GPU nodes share? HF_HOME/HF_HUB_CACHE the same there?)")
    shape = dims(folder, trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        listed = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [name for name in listed if not (folder / name).is_file()]
        if missing:
            raise TargetUnreadable(f"{index} lists {len(missing)} file(s) missing from {folder} (e.g. {missing[0]}): "
                                   "an unfinished download; fetch the target again")
    if not files:
        raise TargetUnreadable(f"{folder}: no *.safetensors weights (the hidden-state check and speculators read them)")
    parameters = other = 0
    for path in files:
        for tensor in _safetensors_header(path).values():
            start, stop = tensor["data_offsets"]
            if tensor["dtype"] in FLOAT_DTYPES:
                parameters += math.prod(tensor["shape"])
            else:
                other += stop - start
    return TargetFacts(str(folder), shape.hidden_size, shape.num_hidden_layers, len(files), parameters, other,
                       tokenizer.chat_template is not None)


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:2])


CUDA_12_GUIDANCE = (
    "update the driver to one that supports CUDA {build} (CUDA 13 needs driver {cuda13}+), or, on CUDA 12 "
    "drivers, install the CUDA 12 builds into the environment: torch {torch} from PyTorch's cu128 index "
    "(cu126 for older CUDA 12 drivers) and the vLLM {vllm} wheel built for the same CUDA (docs/cluster.md, "
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


def _vllm_check(vllm: str | BaseException, node: Node, env: EnvironmentPlan) -> Check:
    if isinstance(vllm, str):
        return passed(VLLM, f"vLLM {vllm}" + (" with its CUDA kernels" if env.device == "cuda" else ""))
    return failed(VLLM, (
        f"{_one_line(vllm, 400)}: a vLLM wheel runs with the torch build it was compiled against; this "
        f"environment has torch {node.torch_version}: install the vLLM {env.versions.get('vllm', '')} wheel built for "
        "this torch's CUDA, or rebuild the environment from requirements/ (docs/cluster.md, 'CUDA 12 drivers')"
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
        target_check = failed(TARGET, _one_line(target))
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
        checks = [failed(TORCH, f"{_one_line(node)}: rebuild the environment (DRAFTLINE_ENV=gpu ./draftline true, "
                                "docs/cluster.md)")]
        devices, memory = (GPUS, GPU_MEMORY) if env.device == "cuda" else (CORES, HOST_MEMORY)
        checks += _skip_all([VERSIONS, DRIVER, VLLM, devices, memory, TARGET], f"'{TORCH}' failed")
        return write_part(out_dir, "environment", checks)
    log.info("node: %s", node)
    vllm = _tried(lambda: import_vllm(env.device), "importing vLLM")
    target = _tried(lambda: read_target(target_dir, trust_remote_code), "reading the target")
    checks = environment_checks(node, env, target, vllm)
    for c in checks:
        log.info("%s: %s: %s", c.name, c.status, c.reason)
    return write_part(out_dir, "environment", checks, {"environment_seconds": round(time.monotonic() - started, 1)})


# ---------------------------------------------------------------- regeneration (one engine)


def first_rows(path: str | Path, n: int) -> list[dict]:
    rows = []
    for row in conversation_file.iter_rows(path):
        if len(rows) == n:
            break
        rows.append(row)
    return rows


def run_regenerate(part: Part, prompts_path: str | Path, stages: RegenerationStages, preflight: PreflightSettings) -> dict:
    """The regeneration part (after the environment part): load the target as regeneration does,
    answer the first `preflight.prompts` prompts, decode the first `preflight.rows` greedily (the
    reference), tokenize their conversations. Writes prompts.jsonl, conversations.jsonl,
    reference.json and tokenized/ into the part's folder."""
    from draftline.runtime.vllm_engine import shutdown, target_llm
    from draftline.stages import regenerate
    from draftline.stages import tokenize as tokenization

    out, settings = Path(part.out_dir), stages.regenerate
    out.mkdir(parents=True, exist_ok=True)
    names = [LOAD, REGENERATION, REFERENCE, TOKENIZATION]
    upstream = _upstream(part.upstream_dir, "environment")
    if upstream:
        return write_part(out, "regenerate", _skip_all(names, f"the environment check failed ({'; '.join(upstream)})"))
    rows = first_rows(prompts_path, preflight.prompts)
    if not rows:
        raise ValueError(f"{prompts_path}: no training prompts to check the run with")
    conversation_file.write(out / "prompts.jsonl", rows)
    checks, measured = [], {"prompts": len(rows), "gpus_per_job": settings.ranks}
    engine: dict = {}

    def load() -> Check:
        t0 = time.monotonic()
        # stats on: evaluation's counters (read by the greedy reference below) need them; no output changes
        engine["llm"] = target_llm(part.target_dir, settings, disable_log_stats=False)
        seconds = measured["regeneration_load_seconds"] = round(time.monotonic() - t0, 1)
        return passed(LOAD, f"loaded in {seconds:.1f} s ({settings.dtype}, tensor x pipeline parallel "
                            f"{settings.tensor_parallel_size} x {settings.pipeline_parallel_size})")

    checks.append(_attempt(LOAD, load, part.log_hint))
    if "llm" not in engine:
        checks += _skip_all(names[1:], f"the target did not load ('{LOAD}')")
        return write_part(out, "regenerate", checks, measured)
    llm = engine.pop("llm")
    conversations = out / "conversations.jsonl"

    def answer() -> Check:
        summary = regenerate.regenerate(part.target_dir, out / "prompts.jsonl", conversations,
                                        out / "regenerate_summary.json", settings, llm=llm)
        rate = measured["regeneration_tokens_per_s"] = summary["tokens_per_second"]
        cut = summary["answers_truncated"]
        return passed(REGENERATION, (
            f"{summary['rows_out']} of {len(rows)} prompts answered, {summary['generated_tokens']:,} tokens at "
            f"{rate:,.1f} tok/s ({len(rows)} at once); {cut} of {summary['turns_generated']} answers cut at "
            f"regenerate.max_new_tokens {settings.max_new_tokens}"
        ), **{k: summary[k] for k in ("rows_out", "generated_tokens", "answers_truncated", "seconds")})

    if stages.enabled:
        checks.append(_attempt(REGENERATION, answer, part.log_hint))
    else:
        conversation_file.write(conversations, rows)
        checks.append(not_run(REGENERATION, "regenerate.enabled is false: the dataset's answers are trained"))
    checks.append(_attempt(REFERENCE, lambda: _greedy_reference(llm, out, preflight.rows, stages.evaluate, measured),
                           part.log_hint))
    shutdown(llm)
    llm = None  # the closure above holds it: release the engine before the next stage

    def tokenize() -> Check:
        picked = first_rows(conversations, preflight.rows)
        conversation_file.write(out / "rows.jsonl", picked)
        folder = out / "tokenized"
        summary = tokenization.tokenize(part.target_dir, out / "rows.jsonl", folder / "dataset",
                                        folder / "token_freq.pt", folder / "summary.json", stages.tokenize)
        measured["rows"] = summary["rows"]
        return passed(TOKENIZATION, f"{summary['rows']} rows, {summary['total_tokens']:,} tokens, "
                                    f"{summary['trainable_tokens']:,} trained (assistant) tokens")

    if checks[1].failed:
        checks.append(not_run(TOKENIZATION, f"'{REGENERATION}' failed"))
    else:
        checks.append(_attempt(TOKENIZATION, tokenize, part.log_hint))
    return write_part(out, "regenerate", checks, measured)


def _greedy_reference(llm, out: Path, rows: int, evaluate_settings, measured: dict) -> Check:
    """The target's greedy answers to the first `rows` prompts, as evaluation decodes them
    (reference.json): what the speculative part's outputs must equal."""
    from draftline.stages import evaluate

    chat_template = Path(evaluate_settings.chat_template).read_text() if evaluate_settings.chat_template else None
    prompts = evaluate.read_prompts(out / "prompts.jsonl", rows)
    prompts, skipped = evaluate.fitting_prompts(llm.get_tokenizer(), prompts, evaluate_settings, chat_template)
    if not prompts:
        raise ValueError(f"no prompt fits max_model_len={evaluate_settings.max_model_len} with "
                         f"evaluate.max_new_tokens {evaluate_settings.max_new_tokens}")
    run = evaluate.timed_generate(llm, prompts, evaluate_settings, chat_template)
    record = {"prompts": [{"id": p.id, "messages": p.messages} for p in prompts], "token_ids": run["token_ids"],
              "skipped": skipped, "max_new_tokens": evaluate_settings.max_new_tokens}
    with atomic_file(out / "reference.json") as f:
        f.write(json.dumps(record) + "\n")
    measured["greedy_tokens_per_s"] = run["output_tokens_per_s"]
    return passed(REFERENCE, f"{len(prompts)} prompts x <= {evaluate_settings.max_new_tokens} tokens, "
                             f"{run['output_tokens']:,} tokens at {run['output_tokens_per_s']} tok/s")


# ---------------------------------------------------------------- hidden states (one engine)


def fidelity_check(target_dir: str | Path, samples: list[tuple], extracted: list[int], min_top1: float, where: str,
                   trust_remote_code: bool = False) -> Check:
    """The hidden-state fidelity check on the extracted rows (draftline.fidelity, the same check
    every extraction shard passes): the one place the preflight calls it. `samples` are (row,
    hidden_states [seq, n_layers, hidden] float, token_ids, loss_mask)."""
    from draftline import fidelity

    head = fidelity.read_head(target_dir, trust_remote_code)
    measured = fidelity.measure(head, samples, extracted)
    details = {k: measured.get(k) for k in ("top1_assistant", "top1_all", "assistant_tokens")}
    try:
        fidelity.check(measured, min_top1, where)
    except fidelity.FidelityError as error:
        return failed(FIDELITY, str(error), **details)
    return passed(FIDELITY, (
        f"the target's own head on the stored last layer predicts the next token on {measured['top1_assistant']} of "
        f"{measured['assistant_tokens']} assistant positions (bar {min_top1}); every stored layer distinct"
    ), **details)


def run_hidden_states(
    part: Part, layer_ids_path: str | Path, engine, *, backend: str = "vllm", format: str = "full",
    fidelity_min_top1: float = 0.9,
) -> dict:
    """The hidden-state part (after the regeneration part): its tokenized rows through the
    extraction stage (one shard of them), then the fidelity check on its files."""
    from draftline.artifacts import layer_ids as layer_ids_file
    from draftline.artifacts.hidden_states import file_name, read_states
    from draftline.stages import hidden_states

    target_dir, regenerate_dir, log_hint = part.target_dir, part.upstream_dir, part.log_hint
    out = Path(part.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    upstream = _upstream(regenerate_dir, "regenerate")
    record = read_part(regenerate_dir)
    tokenized = {c.name: c.status for c in record["checks"]}.get(TOKENIZATION)
    if tokenized != "pass":
        why = f"no tokenized rows ({'; '.join(upstream) or f'regenerate: {TOKENIZATION} {tokenized}'})"
        return write_part(out, "hidden_states", _skip_all([EXTRACTION, FIDELITY], why))
    dataset = Path(regenerate_dir) / "tokenized" / "dataset"
    shard = out / "shard"
    measured: dict = {}
    result: dict = {}

    def extract() -> Check:
        manifest = result["manifest"] = hidden_states.extract_shard(
            dataset, target_dir, layer_ids_path, ShardJob(0, 1, shard, staging_root=out / ".staging"), engine,
            hidden_states.ExtractionSettings(
                backend=backend, format=format,
                fidelity=FidelitySettings(rows=0),  # checked once, below, as its own check with the run's bar
            ),
        )
        measured["extraction_load_seconds"] = manifest["load_seconds"]
        rate = measured["extraction_tokens_per_s"] = manifest["tokens_per_s"]
        return passed(EXTRACTION, (
            f"{manifest['num_rows']} rows, {manifest['tokens']:,} tokens, layers {manifest['layer_ids']['extracted']} "
            f"({backend}, {format}, {manifest['dtype']}), every file validated; engine ready in "
            f"{manifest['load_seconds']} s, {rate} tok/s"
        ), bytes=manifest["bytes"])

    checks = [_attempt(EXTRACTION, extract, log_hint)]
    if "manifest" not in result:
        checks.append(not_run(FIDELITY, f"'{EXTRACTION}' failed"))
        return write_part(out, "hidden_states", checks, measured)

    def fidelity() -> Check:
        from datasets import load_from_disk

        rows = load_from_disk(str(dataset)).with_format(None)
        extracted = layer_ids_file.read(layer_ids_path).extracted
        samples = [(i, read_states(shard / file_name(i), format), row["input_ids"], row["loss_mask"])
                   for i, row in enumerate(rows)]
        return fidelity_check(target_dir, samples, extracted, fidelity_min_top1, f"preflight extraction ({shard})",
                              engine.trust_remote_code)

    checks.append(_attempt(FIDELITY, fidelity, log_hint))
    return write_part(out, "hidden_states", checks, measured)


# ---------------------------------------------------------------- speculative decoding (one engine)


def run_speculative(
    part: Part, config_dir: str | Path, evaluate_settings, *, draft_vocab_size: int, trust_remote_code: bool = False,
) -> dict:
    """The speculative part (after the regeneration part): an untrained draft of the run's config
    (vocab maps from the tokenized rows' frequencies), served in vLLM; its greedy outputs must
    equal the reference."""
    from draftline.runtime.vllm_engine import shutdown
    from draftline.stages import evaluate, vocab

    target_dir, regenerate_dir, log_hint = part.target_dir, part.upstream_dir, part.log_hint
    out = Path(part.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    statuses = {c.name: c.status for c in read_part(regenerate_dir)["checks"]}
    missing = [n for n in (REFERENCE, TOKENIZATION) if statuses.get(n) != "pass"]
    if missing:
        why = f"regenerate: {', '.join(missing)} did not pass"
        return write_part(out, "speculative", _skip_all([DRAFT, LOSSLESS], why))
    reference = json.loads((Path(regenerate_dir) / "reference.json").read_text())
    draft = out / "untrained_draft"
    measured: dict = {}

    def build() -> Check:
        tokenized = Path(regenerate_dir) / "tokenized"
        vocab.write_vocab(tokenized / "token_freq.pt", target_dir, draft_vocab_size, out / "d2t.npy", out / "t2d.npy",
                          out / "vocab_summary.json", trust_remote_code)
        evaluate.make_untrained_draft(config_dir, out / "d2t.npy", out / "t2d.npy", draft, target=target_dir,
                                      seed=evaluate_settings.seed)
        config = json.loads((draft / "config.json").read_text())
        return passed(DRAFT, f"{config['speculators_model_type']} draft of {config_dir} (draft vocab "
                             f"{config['draft_vocab_size']:,}), fresh weights, tensors checked")

    checks = [_attempt(DRAFT, build, log_hint)]
    if checks[0].failed:
        checks.append(not_run(LOSSLESS, f"'{DRAFT}' failed"))
        return write_part(out, "speculative", checks, measured)

    def decode() -> Check:
        chat_template = Path(evaluate_settings.chat_template).read_text() if evaluate_settings.chat_template else None
        prompts = [evaluate.Prompt(p["id"], p["messages"]) for p in reference["prompts"]]
        t0 = time.monotonic()
        llm = evaluate.engine_for(target_dir, evaluate_settings, draft=draft)
        measured["speculative_load_seconds"] = round(time.monotonic() - t0, 1)
        try:
            run = evaluate.timed_generate(llm, prompts, evaluate_settings, chat_template)
            evaluate.check_lossless(prompts, reference["token_ids"], run["token_ids"], "untrained", llm.get_tokenizer())
        finally:
            shutdown(llm)
        numbers = evaluate.acceptance(run["counters"], evaluate_settings.num_speculative_tokens)
        measured["speculative_tokens_per_s"] = run["output_tokens_per_s"]
        return passed(LOSSLESS, (
            f"{len(prompts)} prompts, {run['output_tokens']:,} tokens: equal to the target's own greedy outputs token "
            f"for token; mean acceptance length {numbers['mean_acceptance_length']:.2f} with k="
            f"{evaluate_settings.num_speculative_tokens} (an untrained draft: about 1)"
        ), mean_acceptance_length=round(numbers["mean_acceptance_length"], 4))

    checks.append(_attempt(LOSSLESS, decode, log_hint))
    return write_part(out, "speculative", checks, measured)


# ---------------------------------------------------------------- the verdict


class PreflightFailed(RuntimeError):
    """Some preflight check failed; the report says which and what to fix."""


def verdict(report: dict, parts: dict[str, str | Path], report_md: str | Path) -> None:
    """Raise PreflightFailed naming the failed checks after removing the parts that hold them,
    so the next `preflight` reruns those parts (and what follows them) instead of reporting the
    same results again."""
    if report["ok"]:
        log.info("preflight: all %d checks passed or were not needed", len(report["checks"]))
        return
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    for folder in parts.values():
        if part_failures(read_part(folder)):
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed %s: its failed checks rerun with the next `preflight`", folder)
    lines = "; ".join(f"{c['name']}: {c['reason']}" for c in failing)
    raise PreflightFailed(f"{len(failing)} preflight check(s) failed (details in {report_md}): {lines}")

