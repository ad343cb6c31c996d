"""Every vLLM engine draftline runs: regeneration, hidden-state extraction and evaluation load
the target here, the same way, and stop it here.

One place decides dtype, eager mode and the vLLM CPU settings, so the stages cannot drift
apart; a stage adds only what is its own (a speculative config, a KV connector) as
`engine_args`.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
from collections.abc import Collection
from dataclasses import dataclass, field, fields

from draftline.runtime.logs import CONFIGURE_LOGGING, LOGGING_CONFIG_PATH
from draftline.settings import DEFAULTS, DraftlineConfig, output_changing
from draftline.settings.target import vllm_ranks

log = logging.getLogger(__name__)


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def vllm_cuda_env() -> dict:
    """vLLM variables a CUDA engine needs in this environment (the user's own values win): without
    flashinfer (an optional kernel package: a cluster's ready environment or the GPU test host's
    bundle may lack it) vLLM's sampler must not ask for it, or the engine does not start."""
    import importlib.util

    # spawn: a job has started CUDA (torch.cuda.is_available, the fidelity check) before its engine,
    # and a forked engine process cannot use CUDA then
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    if not importlib.util.find_spec("flashinfer"):
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    return env


def vllm_has_engine_arg(name: str) -> bool:
    """Whether the installed vLLM takes engine argument `name` (the two vLLM versions the GPU locks
    offer differ: 0.26 has no per_request_spec_decode_metrics)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return name in {f.name for f in dataclasses.fields(EngineArgs)}


def dtype_for(requested: str, cuda: bool) -> str:
    """float32 on CPU (AVX2-only CPUs run bf16 ~5x slower), bfloat16 on CUDA."""
    if requested != "auto":
        return requested
    return "bfloat16" if cuda else "float32"


def default_dtype(requested: str = "auto") -> str:
    """`dtype_for` on this machine."""
    return dtype_for(requested, has_cuda())


def enforce_eager_for(requested: bool | str | None, cuda: bool) -> bool:
    """"auto" (or None): eager on CPU (torch.compile costs ~60 s of start-up per engine there for
    no speed-up), compiled on CUDA."""
    if requested in ("auto", None):
        return not cuda
    if not isinstance(requested, bool):
        raise ValueError(f"enforce_eager must be true, false or 'auto', got {requested!r}")
    return requested


@dataclass(frozen=True)
class EngineSettings:
    """How every vLLM engine loads the target (the `vllm:` config block with target.* and the
    plan's resolved dtype and eager mode); the stages' settings extend this. Built once per plan
    by `engine_settings`, passed to the jobs as one param and handed on as it is."""

    max_model_len: int = DEFAULTS.tokenize.max_seq_len  # prompt + answer must fit
    dtype: str = DEFAULTS.target.dtype
    trust_remote_code: bool = DEFAULTS.target.trust_remote_code
    enforce_eager: bool | str | None = None  # None/"auto": see enforce_eager_for
    seed: int = 0
    threads: int | None = None  # vLLM CPU threads (the job's)
    # target.*_parallel_size: one vLLM rank (a GPU, or a CPU worker process) per tp x pp
    tensor_parallel_size: int = DEFAULTS.target.tensor_parallel_size
    pipeline_parallel_size: int = DEFAULTS.target.pipeline_parallel_size
    # vllm.*: None = vLLM's own default (gpu_memory_utilization: gpu_memory_share's)
    gpu_memory_utilization: float | None = DEFAULTS.vllm.gpu_memory_utilization
    max_num_seqs: int | None = DEFAULTS.vllm.max_num_seqs
    enable_expert_parallel: bool = DEFAULTS.vllm.enable_expert_parallel
    quantization: str | None = DEFAULTS.vllm.quantization
    kv_cache_dtype: str = DEFAULTS.vllm.kv_cache_dtype
    cpu_kv_cache_gib: int = DEFAULTS.vllm.cpu_kv_cache_gib
    engine_args: dict = field(default_factory=dict)  # vllm.engine_args, passed through

    @property
    def ranks(self) -> int:
        return vllm_ranks(self.tensor_parallel_size, self.pipeline_parallel_size)

    def stage(self, cls, **own):
        """These settings as a stage's settings `cls` (a subclass: RegenerateSettings,
        EvaluateSettings) with the stage's own fields (and e.g. the job's threads)."""
        return cls(**{**{f.name: getattr(self, f.name) for f in fields(EngineSettings)}, **own})


# The vllm.* keys that can change what the engine computes (they decide staleness): those the schema
# marks `x-changes-outputs: true`; the others change only speed or memory. engine_args counts whole:
# draftline cannot tell what a key does.
OUTPUT_FIELDS = output_changing("vllm")
# vLLM arguments draftline sets itself (from target.*, the plan, or the stage): not in engine_args
OWN_ARGS = {
    "model": "target.model", "tokenizer": "target.model", "revision": "target.revision",
    "dtype": "target.dtype", "trust_remote_code": "target.trust_remote_code",
    "tensor_parallel_size": "target.tensor_parallel_size", "pipeline_parallel_size": "target.pipeline_parallel_size",
    "seed": "regenerate.seed / evaluate.seed", "speculative_config": "evaluate (the draft) and extraction",
    "kv_transfer_config": "hidden-state extraction", "enable_prefix_caching": "hidden-state extraction",
    "disable_log_stats": "evaluation's counters",
}


# vllm.* keys with a setting of their own (not to be passed again through engine_args)
VLLM_KEYS = ("gpu_memory_utilization", "max_num_seqs", "max_model_len", "enable_expert_parallel", "quantization",
             "kv_cache_dtype", "enforce_eager")


class EngineSettingsError(ValueError):
    """A `vllm:` setting that cannot apply; the message names the key and what to do."""


def engine_settings(config: dict | DraftlineConfig, resolved: dict) -> EngineSettings:
    """The one EngineSettings of a plan: the config's typed `vllm:` block and target.* with the
    dtype and eager mode `resolved` for the planned device (plan.resolved_settings()["engine"])."""
    config = DraftlineConfig.read(config)
    block, target = config.vllm, config.target
    # sorted (nested too), so a reordered config is the same param
    engine_args = json.loads(json.dumps(block.engine_args, sort_keys=True))
    for key in sorted(engine_args):
        own = f"vllm.{key}" if key in VLLM_KEYS else OWN_ARGS.get(key)
        if own:
            raise EngineSettingsError(
                f"vllm.engine_args.{key}: draftline sets this vLLM argument itself (from {own}); "
                f"remove it from vllm.engine_args" + (f" and set {own}" if own.startswith(("vllm.", "target.")) else "")
            )
    if block.enable_expert_parallel and resolved.get("device") == "cpu":
        raise EngineSettingsError(
            "vllm.enable_expert_parallel: true is refused on CPU (the vLLM CPU build crashes with it: "
            "SIGSEGV in cpu_fused_moe); set it to false, or plan for CUDA (device: cuda)"
        )
    return EngineSettings(
        max_model_len=planned_max_model_len(config),
        dtype=resolved["dtype"],
        trust_remote_code=target.trust_remote_code,
        enforce_eager=resolved["enforce_eager"],
        tensor_parallel_size=target.tensor_parallel_size,
        pipeline_parallel_size=target.pipeline_parallel_size,
        gpu_memory_utilization=block.gpu_memory_utilization,
        max_num_seqs=block.max_num_seqs,
        enable_expert_parallel=block.enable_expert_parallel,
        quantization=block.quantization,
        kv_cache_dtype=block.kv_cache_dtype,
        cpu_kv_cache_gib=block.cpu_kv_cache_gib,
        engine_args=engine_args,
    )


def planned_max_model_len(config: dict | DraftlineConfig) -> int:
    """The context of a generating engine (regeneration, evaluation): vllm.max_model_len, or
    tokenize.max_seq_len when it is null (decided here only: the plan's sizing reads it too)."""
    config = DraftlineConfig.read(config)
    return config.vllm.max_model_len or config.tokenize.max_seq_len


def output_settings(settings: EngineSettings, without: Collection[str] = ()) -> dict:
    """The fields of `settings` that can change outputs, as plain values (a param that decides
    staleness; sorted, so reordering the schema reruns nothing); `without` leaves out fields a stage
    does not use (extraction: max_model_len)."""
    return {key: getattr(settings, key) for key in sorted(OUTPUT_FIELDS) if key not in without}


# The share of each GPU an engine takes when vllm.gpu_memory_utilization is null, decided here only
# (gpu_memory_share): a generating engine (regeneration, evaluation) vLLM's own default, which
# draftline does not pass (vllm/config/cache.py); an extracting one (and the online server) less,
# leaving room for the connector's copies of the states.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
EXTRACTION_GPU_MEMORY_UTILIZATION = 0.85


def gpu_memory_share(settings: EngineSettings, extraction: bool = False) -> float:
    """The share of each GPU an engine with `settings` takes (an extracting one if `extraction`):
    vllm.gpu_memory_utilization, or its default for what the engine does."""
    if settings.gpu_memory_utilization is not None:
        return settings.gpu_memory_utilization
    return EXTRACTION_GPU_MEMORY_UTILIZATION if extraction else VLLM_GPU_MEMORY_UTILIZATION


def engine_kwargs(settings: EngineSettings, cuda: bool, extraction: bool = False) -> dict:
    """The vLLM engine arguments `settings` stand for (vllm.LLM keyword arguments; the online
    server passes the same as flags); `extraction`: an engine that extracts hidden states
    (gpu_memory_share). A setting left at its default is not passed, so vLLM's own default applies."""
    kwargs = dict(
        dtype=dtype_for(settings.dtype, cuda),
        max_model_len=settings.max_model_len,
        enforce_eager=enforce_eager_for(settings.enforce_eager, cuda),
        trust_remote_code=settings.trust_remote_code,
        seed=settings.seed,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
    )
    if cuda and (extraction or settings.gpu_memory_utilization is not None):  # else vLLM's own
        kwargs["gpu_memory_utilization"] = gpu_memory_share(settings, extraction)
    if settings.max_num_seqs is not None:
        kwargs["max_num_seqs"] = settings.max_num_seqs
    if settings.enable_expert_parallel:
        kwargs["enable_expert_parallel"] = True
    if settings.quantization is not None:
        kwargs["quantization"] = settings.quantization
    if settings.kv_cache_dtype != "auto":
        kwargs["kv_cache_dtype"] = settings.kv_cache_dtype
    return {**kwargs, **settings.engine_args}


class NotEnoughCores(ValueError):
    """vLLM CPU needs a core of its own for every rank."""


BIND = "VLLM_CPU_OMP_THREADS_BIND"
IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"  # "0": the engine core runs in the job's process
# What configure_vllm_cpu set in this process: a later engine (another parallel size) may
# replace those values; anything else in the environment was set by the user and wins.
_set_here: dict[str, str] = {}


def users_setting(key: str) -> bool:
    """Whether the user, not configure_vllm_cpu or target_llm, set `key` in this process's environment."""
    return key in os.environ and os.environ[key] != _set_here.get(key)


def _set_env(key: str, value: str | None) -> None:
    if users_setting(key):
        return
    if value is None:
        os.environ.pop(key, None)
        _set_here.pop(key, None)
    else:
        os.environ[key] = _set_here[key] = value


def cpu_bind_lists(ranks: int, cores: Collection[int], threads: int | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `ranks` CPU workers: one core list per rank, '|'-separated
    ("0|1", "0,1|2,3"), each rank `threads // ranks` cores (at least one) of `cores`.

    vLLM's own placement ("auto") takes one NUMA node per rank and stops on a one-node machine
    ("Not enough allowed NUMA nodes to bind threads").
    """
    cores = sorted(cores)
    if len(cores) < ranks:
        raise NotEnoughCores(
            f"target.tensor_parallel_size x target.pipeline_parallel_size = {ranks} vLLM CPU ranks, but "
            f"this process may use only {len(cores)} core(s) ({','.join(map(str, cores))}): vLLM CPU binds "
            f"each rank's threads to cores of its own ({BIND}). Lower the parallel sizes, run the job "
            f"where it may use at least {ranks} cores, or set {BIND} yourself (one core list per rank, "
            "'|'-separated, e.g. \"0|1\")"
        )
    per_rank = len(cores) // ranks
    if threads:
        per_rank = max(1, min(per_rank, threads // ranks))
    return "|".join(",".join(map(str, cores[r * per_rank : (r + 1) * per_rank])) for r in range(ranks))


def configure_vllm_cpu(threads: int | None = None, kv_cache_gib: int = DEFAULTS.vllm.cpu_kv_cache_gib,
                       ranks: int = 1, in_process: bool = True) -> None:
    """Set vLLM CPU environment before `import vllm` creates an engine.

    vLLM CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB, vllm.cpu_kv_cache_gib). By
    default it pins its OpenMP threads to fixed cores, so two jobs running side by side (two
    hidden-state shards on one machine) would share one core; instead, one rank leaves placement
    to the OS and runs exactly `threads` threads. Several ranks (tensor/pipeline parallel: one
    worker process each) must be bound: each gets its own cores out of those this process may
    use (`cpu_bind_lists`). Values the user set in the environment win.
    """
    if has_cuda():
        return
    for key, value in vllm_cpu_env(threads, kv_cache_gib, ranks, user_bind=users_setting(BIND)).items():
        _set_env(key, value)
    # One rank: the engine core runs in this process (vLLM's uniprocess executor), not in a
    # spawned EngineCore process that imports torch and vLLM again: about half the start-up, the
    # same greedy tokens (measured: benchmarks/results/engine_start.md). Several
    # ranks keep vLLM's worker processes, each bound to its cores; so does an engine whose KV
    # connector finishes its work while the caller waits (`in_process=False`: extraction).
    in_process = in_process and ranks == 1
    _set_env(IN_PROCESS, "0" if in_process else None)
    if in_process and threads and os.environ.get(IN_PROCESS) == "0":
        # torch read OMP_NUM_THREADS when it was imported (before this), and vLLM's CPU worker
        # turns torch.set_num_threads off in its process: set the job's threads now
        import torch

        torch.set_num_threads(threads)


def vllm_cpu_env(threads: int | None, kv_cache_gib: int, ranks: int = 1, user_bind: bool = False) -> dict:
    """The vLLM CPU variables (None: unset) for an engine of `ranks` ranks: an in-process engine's
    (configure_vllm_cpu) and the online server's process alike."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib))}  # vllm.cpu_kv_cache_gib
    if ranks > 1:
        if not user_bind:
            env[BIND] = cpu_bind_lists(ranks, os.sched_getaffinity(0), threads)
        env["OMP_NUM_THREADS"] = None  # vLLM sets each rank's from its core list
    else:
        env[BIND] = "nobind" if threads else None
        env["OMP_NUM_THREADS"] = str(threads) if threads else None
    return env


def target_llm(
    target_dir,
    settings: EngineSettings,
    *,
    extraction: bool = False,
    in_process: bool = True,
    **engine_args,
):
    """The target in a vLLM engine, loaded with `settings` (engine_kwargs);
    `extraction`: an engine that extracts hidden states (its GPU share: gpu_memory_share);
    `in_process`: on CPU, a one-rank engine's core may run in this process (configure_vllm_cpu);
    `engine_args` (a speculative config, a KV connector, stats) go to `vllm.LLM` as they are."""
    configure_vllm_cpu(settings.threads, settings.cpu_kv_cache_gib, ranks=settings.ranks, in_process=in_process)
    if not in_process:
        engine_core_beside_this_process()
    if has_cuda():
        for key, value in vllm_cuda_env().items():
            os.environ.setdefault(key, value)
    # vLLM's records go to the job's log (less logs.NOISE) as every other library's do, not to the
    # terminal between Snakemake's lines: a job's through its logging config (logs.log_to, every
    # process of the engine), elsewhere by propagating to this process's own handlers; a value the
    # user set wins
    if not os.environ.get(LOGGING_CONFIG_PATH):
        _set_env(CONFIGURE_LOGGING, "0")
    fresh_vllm_envs()
    from vllm import LLM

    return LLM(model=str(target_dir), **engine_kwargs(settings, has_cuda(), extraction), **engine_args)


def engine_core_beside_this_process() -> None:
    """For an engine whose KV connector finishes a request's file in the engine core's next step
    (hidden-state extraction): its core must run in a process of its own. A core in this process
    takes no step while this process waits for the last chunk's files, which then never come. A
    VLLM_ENABLE_V1_MULTIPROCESSING=0 in the environment, the user's or one passed down by a parent
    process that ran an in-process engine (seen: benchmarks/cuda/tp_states.py under a pytest worker,
    hung until its timeout), is replaced for this engine, and said."""
    if os.environ.get(IN_PROCESS) == "0":
        if users_setting(IN_PROCESS):
            log.warning("%s=0 in the environment is not used for this engine: hidden-state extraction needs its "
                        "engine core in a process of its own (in this one the last files are never written)", IN_PROCESS)
        os.environ[IN_PROCESS] = _set_here[IN_PROCESS] = "1"


def fresh_vllm_envs() -> None:
    """Make vLLM read the environment set above for the next engine: once an engine has started,
    vLLM caches every VLLM_* variable for the process (vllm.envs.enable_envs_cache, called in the
    engine core's init), so a second engine of the same process would otherwise start with the
    first one's values (seen: an extraction engine after an in-process one ran its core in-process
    too, and its last chunk's file lock was never released)."""
    envs = sys.modules.get("vllm.envs")
    if envs is not None and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()


def shutdown(llm) -> None:
    """Stop the engine's processes now (memory, cores), not at garbage collection, so the next
    engine of the same job starts on a free machine."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as error:  # noqa: BLE001 - best effort; the process exits anyway
        log.debug("engine shutdown: %s", error)
    gc.collect()
