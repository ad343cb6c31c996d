"""Where the target runs: CUDA when there is a GPU, vLLM's CPU build otherwise.

One place decides dtype and the vLLM CPU settings so regeneration, hidden-state extraction
and evaluation load the target the same way.
"""

from __future__ import annotations

import os


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
    *,
    dtype: str,
    max_model_len: int,
    enforce_eager: bool | None,
    trust_remote_code: bool,
    seed: int,
    threads: int | None,
    **engine_args,
):
    """The target in a vLLM engine, loaded the same way by regeneration and evaluation.

    `enforce_eager=None` means eager on CPU (torch.compile costs minutes of start-up there for
    no speed-up) and compiled on CUDA; `engine_args` go to `vllm.LLM` as they are.
    """
    configure_vllm_cpu(threads)
    from vllm import LLM

    return LLM(
        model=str(target_dir),
        dtype=default_dtype(dtype),
        max_model_len=max_model_len,
        enforce_eager=not has_cuda() if enforce_eager is None else enforce_eager,
        trust_remote_code=trust_remote_code,
        seed=seed,
        **engine_args,
    )
