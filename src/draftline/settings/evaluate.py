"""The trained draft's acceptance, and the checks and sizing around the run (`evaluate:`, `preflight:`, `sizing:`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, StringConstraints, WithJsonSchema

from draftline.settings.fields import Block, Number, setting

HELD_OUT = ("validation", "test")  # measured always, from prompts.validation and prompts.test
SET_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


def _not_held_out(name: str) -> str:
    if name in HELD_OUT:
        raise ValueError(f"{name!r} is a held-out split's name (measured always); name your set otherwise")
    return name


# A prompt set's name: a word of its own, none of the held-out splits'.
PromptSetName = Annotated[str, StringConstraints(pattern=SET_NAME), AfterValidator(_not_held_out),
                          WithJsonSchema({"pattern": SET_NAME, "not": {"enum": list(HELD_OUT)}})]


class EvaluateBlock(Block):
    """Acceptance of the trained draft in vLLM speculative decoding, on the validation and test prompts and on
    any named prompt sets, each measured in the same job and reported separately.
    """

    num_speculative_tokens: int = setting(3, ge=1, description="Draft tokens proposed per step (k in vLLM's speculative_config).")
    max_new_tokens: int = setting(
        128, ge=1,
        description="Greedy tokens generated per held-out prompt (by the target alone and with each draft).",
    )
    max_prompts: int | None = setting(None, ge=1, description="Evaluate at most this many prompts of each set (in file order); null = all.")
    prompt_sets: dict[PromptSetName, str | None] = setting(
        {},
        description=(
            "Your own benchmark prompts: name -> file (JSONL or JSON list in any format prompts.sources reads, or a datasets.save_to_disk "
            "folder); each row's first user turn (with its system turn) is asked. Measured in the same job beside validation and test and "
            "reported per name. The default config names code, math and chat (resources/prompts/eval). A config file given later is merged "
            "into this mapping, so `name: null` is how it leaves a set out."
        ),
    )
    per_prompt_counts: Literal["vllm", "separate_calls"] = setting(
        "vllm",
        description=(
            "Where each prompt's acceptance counts come from (the 95% interval of a set's figure and every comparison paired by prompt "
            "need them). vllm = vLLM's per-request spec-decode metrics, which vLLM keeps from 0.29 (the vllm0.26 GPU lock keeps none: the "
            "sets' figures then come without interval and cannot be paired); separate_calls = after the set's batched call, each prompt "
            "again in a call of its own, its counts the difference of vLLM's counters around it (any vLLM; batch 1, so that part is "
            "slower). The set's figure and speed stay the batched call's."
        ),
    )
    lossless_tolerance: Number = setting(
        0.1, ge=0, le=1,
        description=(
            "Share of a set's prompts whose greedy output with a draft may differ from the target's own before the job stops. Greedy "
            "speculative decoding is lossless up to floating-point numerics (vLLM's own guarantee): in bfloat16 the target verifies a "
            "draft's tokens several at a time, and a near-tie between its top two tokens can come out the other way. Every differing "
            "prompt is counted and named in the results (which output token first differed); a broken engine or draft changes most "
            "outputs and stops here. 0 = every output identical."
        ),
    )
    batch1_prompts: int | None = setting(
        8, ge=0,
        description=(
            "Latency at batch 1, the regime speculative decoding serves: this many of each set's first prompts are generated one at a time "
            "by the target alone and with the draft, in the same engines, and the set's speed-up at batch 1 (time per output token alone "
            "over that with the draft) is recorded with a paired bootstrap interval and the cost of one speculative step in target steps "
            "(where the time goes). null = every prompt of the set; 0 = none. With per_prompt_counts separate_calls the draft's "
            "one-at-a-time calls are those calls."
        ),
    )
    sets_in_one_job: bool = setting(
        False,
        description=(
            "false = one evaluation job per prompt set (a new or edited set reruns that set alone); true = every set in one job, so each "
            "engine (the target alone, the trained draft) starts once instead of once per set: on a GPU an engine start is most of a set's "
            "job (40-90 s against seconds of decoding for the embedded target, "
            "benchmarks/cuda/results/h100_pipeline_whole_dag_2026-12-05.md). Then any change to a set reruns them all. The records are the "
            "same per set."
        ),
    )
    seed: int = setting(0, description="Seed for the untrained baseline draft's random initialization.")


class PreflightBlock(Block):
    """`snakemake ... preflight`: the run's environment and engines checked on a few prompts in jobs with the
    run's own GPUs and settings, before the real run (docs/cluster.md, "Preflight"). Its measured rates
    replace the sizing's assumed ones (docs/sizing.md).
    """

    prompts: int = setting(
        4, ge=1,
        description=(
            "The first prompts of results/prompts/prompts.jsonl answered by the regeneration code (with the run's regenerate settings); "
            "the regeneration rate is measured on them, all at once. On GPUs 64-256 give a rate closer to the run's batches (seconds of "
            "GPU time)."
        ),
    )
    rows: int = setting(
        4, ge=1,
        description=(
            "Of those prompts, how many go on: decoded greedily by the target, tokenized, extracted (hidden states, then the fidelity "
            "check), and decoded with an untrained draft (the lossless check). The extraction rate is measured on them."
        ),
    )


class SizingBlock(Block):
    """What the dry run's sizing line assumes of this machine or cluster (docs/sizing.md). Prints only: no job
    reads it, so a change reruns nothing.
    """

    filesystem_gb_per_s: Number = setting(
        1.0, gt=0,
        description=(
            "Read and write rate, GB/s, of the filesystem holding results/ and the target: the sizing adds the time to load the target's "
            "weights in every vLLM job, to write the hidden states and to read them once per epoch. 1.0 is assumed (a shared parallel "
            "filesystem per node is often 1-5 GB/s, a local NVMe disk more); measure yours (e.g. `dd` of a large file) and set it."
        ),
    )
