"""Every vLLM engine draftline runs: regeneration, hidden-state extraction and evaluation load
the target here, the same way, and stop it here.

One place decides dtype, eager mode and the vLLM CPU settings, so the stages cannot drift
apart; a stage adds only what is its own (a speculative config, a KV connector) as
`engine_args`.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Collection
from dataclasses import dataclass

from draftline.config_schema import default

log = logging.getLogger(__name__)


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


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
    """How a stage loads the target in vLLM (the stages' settings extend this)."""

    max_model_len: int = default("tokenize", "max_seq_len")  # prompt + answer must fit
    dtype: str = default("target", "dtype")
    trust_remote_code: bool = default("target", "trust_remote_code")
    enforce_eager: bool | str | None = None  # None/"auto": see enforce_eager_for
    seed: int = 0
    threads: int | None = None  # vLLM CPU threads (the job's)
    # target.*_parallel_size: one vLLM rank (a GPU, or a CPU worker process) per tp x pp
    tensor_parallel_size: int = default("target", "tensor_parallel_size")
    pipeline_parallel_size: int = default("target", "pipeline_parallel_size")

    @property
    def ranks(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


class NotEnoughCores(ValueError):
    """vLLM CPU needs a core of its own for every rank."""


BIND = "VLLM_CPU_OMP_THREADS_BIND"
# What configure_vllm_cpu set in this process: a later engine (another parallel size) may
# replace those values; anything else in the environment was set by the user and wins.
_set_here: dict[str, str] = {}


def _users(key: str) -> bool:
    return key in os.environ and os.environ[key] != _set_here.get(key)


def _set_env(key: str, value: str | None) -> None:
    if _users(key):
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


def configure_vllm_cpu(threads: int | None = None, kv_cache_gib: int | None = None, ranks: int = 1) -> None:
    """Set vLLM CPU environment before `import vllm` creates an engine.

    vLLM CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB). By default it pins its
    OpenMP threads to fixed cores, so two jobs running side by side (two hidden-state shards
    on one machine) would share one core; instead, one rank leaves placement to the OS and
    runs exactly `threads` threads. Several ranks (tensor/pipeline parallel: one worker process
    each) must be bound: each gets its own cores out of those this process may use
    (`cpu_bind_lists`). Values the user set in the environment win.
    """
    if has_cuda():
        return
    _set_env("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib or 2))
    if ranks > 1:
        if not _users(BIND):
            _set_env(BIND, cpu_bind_lists(ranks, os.sched_getaffinity(0), threads))
        _set_env("OMP_NUM_THREADS", None)  # vLLM sets each rank's from its core list
    else:
        _set_env(BIND, "nobind" if threads else None)
        _set_env("OMP_NUM_THREADS", str(threads) if threads else None)


def target_llm(
    target_dir,
    settings: EngineSettings,
    *,
    gpu_memory_utilization: float | None = None,
    **engine_args,
):
    """The target in a vLLM engine, loaded with `settings`; `engine_args` (a speculative config,
    a KV connector, stats) go to `vllm.LLM` as they are."""
    configure_vllm_cpu(settings.threads, ranks=settings.ranks)
    from vllm import LLM

    cuda = has_cuda()
    if cuda and gpu_memory_utilization is not None:
        engine_args["gpu_memory_utilization"] = gpu_memory_utilization
    return LLM(
        model=str(target_dir),
        dtype=dtype_for(settings.dtype, cuda),
        max_model_len=settings.max_model_len,
        enforce_eager=enforce_eager_for(settings.enforce_eager, cuda),
        trust_remote_code=settings.trust_remote_code,
        seed=settings.seed,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        **engine_args,
    )


def shutdown(llm) -> None:
    """Stop the engine's processes now (memory, cores), not at garbage collection, so the next
    engine of the same job starts on a free machine."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as error:  # noqa: BLE001 - best effort; the process exits anyway
        log.debug("engine shutdown: %s", error)
    gc.collect()
