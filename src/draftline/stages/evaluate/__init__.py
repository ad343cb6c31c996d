"""Acceptance of a draft in vLLM's own speculative decoding, on named prompt sets.

The sets are the validation prompts (for choosing settings), the test prompts (the figures to
report: no choice looks at them) and any files the user names in `evaluate.prompt_sets`. One
evaluation loads the target three times, one after the other, and asks every set with the
same greedy settings: alone (the reference outputs and the speed without speculation), with
the trained draft, and with an untrained draft of the same config (the baseline). All
acceptance numbers come from vLLM's own spec-decode counters (`LLM.get_metrics()`), read
before and after each set's timed `generate`, so warm-up and earlier sets never leak in:

- acceptance rate = accepted tokens / draft tokens
- mean acceptance length = 1 + accepted tokens / drafts (tokens emitted per target step)
- acceptance per position i = accepted at position i / drafts

The spread of a set's mean acceptance length comes from vLLM's per-request spec-decode
metrics (`per_request_spec_decode_metrics="summary"`): a bootstrap over the set's prompts
(resampled with a fixed seed) gives a 95% interval, and the per-prompt values their range.
Each prompt's counts are kept (`per_prompt`, draftline.artifacts.acceptance), so drafts
measured on the same prompts compare prompt by prompt: the trained draft against the untrained
one here (`trained_minus_untrained`, a paired bootstrap), two evaluations with
`benchmarks/compare_acceptance.py`.

Greedy speculative decoding is lossless up to floating-point numerics: each speculative output
is compared with the target's own, every differing prompt counted and named; more of a set's
than `evaluate.lossless_tolerance` allows stop the evaluation (LosslessError).

One module per idea:
- settings: what the step is given (EvaluateSettings)
- prompts: the sets' first-turn prompts, those that fit max_model_len (Prompt, read_prompts, fitting_prompts)
- baseline: the untrained draft of the trained one's config (make_untrained_draft)
- counters: vLLM's spec-decode counters and the acceptance numbers (read_counters, counter_delta, acceptance)
- per_prompt: each prompt's counts, the bootstrap spread, trained vs untrained (spread, check_per_prompt)
- lossless: a draft's outputs against the target's own (LosslessError, check_lossless)
- engines: the target in vLLM with or without a draft, one timed generate (engine_for, timed_generate)
- measure: the target alone on every set, then each draft (target_alone, measure_draft)
- job: what the rules run, each writing its record (evaluate, evaluate_set, evaluate_sets, evaluate_baseline)
- latency: each set's first prompts at batch 1, alone and with the draft (batch1_latency)
"""

from draftline.stages.evaluate.baseline import make_untrained_draft
from draftline.stages.evaluate.counters import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    COUNTERS,
    DRAFT_TOKENS,
    DRAFTS,
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    acceptance,
    counter_delta,
    read_counters,
)
from draftline.stages.evaluate.engines import engine_for, timed_generate, warm_up
from draftline.stages.evaluate.job import evaluate, evaluate_baseline, evaluate_set, evaluate_sets
from draftline.stages.evaluate.lossless import LosslessError, check_lossless
from draftline.stages.evaluate.per_prompt import check_per_prompt, spread, trained_minus_untrained
from draftline.stages.evaluate.prompts import HEADLINE_SET, Prompt, fitting_prompts, read_prompts
from draftline.stages.evaluate.settings import EvaluateSettings

__all__ = [
    "ACCEPTED", "ACCEPTED_PER_POS", "COUNTERS", "DRAFTS", "DRAFT_TOKENS", "GENERATION_TOKENS", "HEADLINE_SET",
    "PROMPT_TOKENS", "EvaluateSettings", "LosslessError", "Prompt", "acceptance", "check_lossless",
    "check_per_prompt", "counter_delta", "engine_for", "evaluate", "evaluate_baseline", "evaluate_set", "evaluate_sets",
    "fitting_prompts", "make_untrained_draft", "read_counters", "read_prompts", "spread", "timed_generate",
    "trained_minus_untrained", "warm_up",
]
