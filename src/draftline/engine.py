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


def configure_vllm_cpu(threads: int | None = None, kv_cache_gib: int | None = None) -> None:
    """Set vLLM CPU environment before `import vllm` creates an engine.

    vLLM CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB). By default it pins its
    OpenMP threads to fixed cores, so two jobs running side by side (two hidden-state shards
    on one machine) would share one core; instead leave placement to the OS and give each
    job exactly `threads` threads. Values already set in the environment win.
    """
    if has_cuda():
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib or 2))
    if threads:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def target_llm(
    target_dir,
    settings: EngineSettings,
    *,
    gpu_memory_utilization: float | None = None,
    **engine_args,
):
    """The target in a vLLM engine, loaded with `settings`; `engine_args` (a speculative config,
    a KV connector, stats) go to `vllm.LLM` as they are."""
    configure_vllm_cpu(settings.threads)
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
