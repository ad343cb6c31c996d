"""Latency at batch 1, the regime speculative decoding serves: a set's first
`evaluate.batch1_prompts` prompts, each generated in a call of its own by the target alone and
with the draft (batch1_runs). Per prompt, time per output token (the request's seconds over its
output tokens, prefill included); for the set, the speed-up (the target's time per output token
over the draft's) with a paired bootstrap interval over the prompts, and where the time goes: what
one speculative step (the draft's k proposals and the target's verification of them) costs in
steps of the target alone, against the tokens one step yields (batch1_latency)."""

from __future__ import annotations

from draftline.artifacts.acceptance import RESAMPLES, interval_95, resamples
from draftline.stages.evaluate.counters import DRAFTS
from draftline.stages.evaluate.engines import timed_generate


def batch1_runs(llm, prompts, settings, chat_template) -> list[dict]:
    """Each prompt alone: its call's seconds, output tokens, spec-decode steps and token ids."""
    return [as_row(prompt.id, timed_generate(llm, [prompt], settings, chat_template)) for prompt in prompts]


def as_row(prompt_id: str, run: dict) -> dict:
    """One prompt's batch-1 call (timed_generate of one prompt) as a latency row."""
    return {"id": prompt_id, "seconds": run["seconds"], "output_tokens": run["output_tokens"],
            "steps": run["counters"][DRAFTS], "token_ids": run["token_ids"][0]}


def batch1_prompt_count(settings, prompts: int) -> int:
    """How many of a set's prompts are timed at batch 1 (`evaluate.batch1_prompts`, null = all)."""
    n = settings.batch1_prompts
    return prompts if n is None else min(n, prompts)


def _ms_per_token(rows: list[dict]) -> float:
    return 1000 * sum(r["seconds"] for r in rows) / max(1, sum(r["output_tokens"] for r in rows))


def batch1_latency(alone: list[dict], draft: list[dict], seed: int = 0, count: int = RESAMPLES) -> dict | None:
    """The draft's batch-1 rows against the target's alone on the same prompts (in order): time per
    output token of each, the speed-up with a paired bootstrap 95% interval (the same resample of
    prompts for both), per-prompt speed-ups, and one speculative step's cost in target steps."""
    if not alone or not draft:
        return None
    if [r["id"] for r in alone] != [r["id"] for r in draft]:
        raise ValueError("batch-1 rows of the target alone and of the draft are not the same prompts in the same order")
    alone_ms, draft_ms = _ms_per_token(alone), _ms_per_token(draft)
    per_prompt = sorted(_ms_per_token([a]) / _ms_per_token([d]) for a, d in zip(alone, draft, strict=True))
    estimates = []
    for sample in resamples(len(alone), seed, count):
        estimates.append(_ms_per_token([alone[i] for i in sample]) / _ms_per_token([draft[i] for i in sample]))
    steps = sum(r["steps"] for r in draft)
    step_ms = 1000 * sum(r["seconds"] for r in draft) / steps if steps else None
    return {
        "prompts": len(alone),
        "ms_per_output_token": {"target_alone": round(alone_ms, 3), "with_draft": round(draft_ms, 3)},
        "speedup": round(alone_ms / draft_ms, 4),
        "bootstrap_95": interval_95(estimates) if len(alone) > 1 else None,
        "bootstrap": f"{count} paired resamples of the prompts, seed {seed}",
        "per_prompt_speedup": {"min": round(per_prompt[0], 4), "median": round(per_prompt[len(per_prompt) // 2], 4),
                               "max": round(per_prompt[-1], 4)},
        # a speculative step: the draft's proposals and the target's verification, in one
        "speculative_step": {
            "steps": steps,
            "ms": round(step_ms, 3) if step_ms else None,
            "in_target_steps": round(step_ms / alone_ms, 3) if step_ms else None,
            "output_tokens_per_step": round(sum(r["output_tokens"] for r in draft) / steps, 4) if steps else None,
        },
        "outputs_unlike_target_alone": sum(a["token_ids"] != d["token_ids"] for a, d in zip(alone, draft, strict=True)),
        "timing": "each prompt in a greedy call of its own (batch 1); time per output token = the calls' seconds "
                  "over their output tokens, prefill included",
    }


def where_the_time_goes(latency: dict) -> str | None:
    """A sentence for a batch-1 speed-up below 1: one speculative step yields this many tokens but
    costs that many target steps."""
    step = (latency or {}).get("speculative_step") or {}
    if not latency or latency["speedup"] >= 1 or not step.get("in_target_steps"):
        return None
    return (f"at batch 1 one speculative step (k draft steps and the target's verification) took "
            f"{step['ms']:.2f} ms, {step['in_target_steps']:.2f} steps of the target alone "
            f"({latency['ms_per_output_token']['target_alone']:.2f} ms), and yielded "
            f"{step['output_tokens_per_step']:.2f} tokens: the draft pays off once a step yields more tokens "
            "than it costs target steps")
