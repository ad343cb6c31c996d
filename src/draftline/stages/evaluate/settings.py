"""What the step is given: the `evaluate:` settings (EvaluateSettings) on the run's engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftline.runtime.vllm_engine import EngineSettings
from draftline.settings import DEFAULTS


@dataclass(frozen=True)
class EvaluateSettings(EngineSettings):
    """The `evaluate:` config block; the target loads as in the other stages (EngineSettings)."""

    num_speculative_tokens: int = DEFAULTS.evaluate.num_speculative_tokens
    max_new_tokens: int = DEFAULTS.evaluate.max_new_tokens
    max_prompts: int | None = DEFAULTS.evaluate.max_prompts  # per set
    # each prompt's counts: vLLM's per-request metrics (vllm) or a call per prompt (separate_calls)
    per_prompt_counts: str = DEFAULTS.evaluate.per_prompt_counts
    batch1_prompts: int | None = DEFAULTS.evaluate.batch1_prompts  # per set, timed one at a time; None = all
    lossless_tolerance: float = DEFAULTS.evaluate.lossless_tolerance  # share of a set's outputs that may differ
    chat_template: str | None = None  # path to a Jinja template replacing the tokenizer's
    # target.chat_template_kwargs: the template's variables (e.g. enable_thinking)
    chat_template_kwargs: dict = field(default_factory=dict)

    @classmethod
    def from_params(cls, params, threads: int) -> EvaluateSettings:
        """What an evaluation job is given (rules/evaluate.smk's EVALUATION_PARAMS): the run's vLLM
        settings (`params.engine`: draftline.runtime.vllm_engine.engine_settings) with the
        `evaluate:` block's own, and the job's threads."""
        return params.engine.stage(
            cls,
            num_speculative_tokens=params.num_speculative_tokens,
            max_new_tokens=params.max_new_tokens,
            max_prompts=params.max_prompts,
            per_prompt_counts=params.per_prompt_counts,
            batch1_prompts=params.batch1_prompts,
            lossless_tolerance=params.lossless_tolerance,
            seed=params.seed,
            chat_template=params.chat_template,
            chat_template_kwargs=params.chat_template_kwargs,
            threads=threads,
        )
