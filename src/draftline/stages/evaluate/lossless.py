"""Greedy speculative decoding is lossless up to floating-point numerics: a draft's outputs against
the target's own, prompt by prompt (check_lossless), within `evaluate.lossless_tolerance`."""

from __future__ import annotations

import logging
import math

from draftline.stages.evaluate.prompts import Prompt

log = logging.getLogger(__name__)


class LosslessError(RuntimeError):
    """More of a set's greedy speculative outputs differ from the target's own than the tolerance allows."""


def first_difference(reference: list[int], speculative: list[int]) -> int | None:
    """The first output token at which the two differ (the shorter one's length where one is a
    prefix of the other); None where they are equal."""
    if list(reference) == list(speculative):
        return None
    return next((i for i, (a, b) in enumerate(zip(reference, speculative, strict=False)) if a != b),
                min(len(reference), len(speculative)))


def check_lossless(prompts: list[Prompt], reference: list[list[int]], speculative: list[list[int]], draft: str,
                   tokenizer=None, tolerance: float = 0.0) -> dict:
    """Each prompt's speculative output against the target's own: the count, and each differing
    prompt with the output token where it first differs. Raises LosslessError when more than
    `tolerance` of the prompts differ, naming the first of them and the text around the difference."""
    if len(reference) != len(prompts) or len(speculative) != len(prompts):
        raise LosslessError(
            f"{draft} draft: {len(speculative)} speculative and {len(reference)} reference outputs for {len(prompts)} prompts"
        )
    differing = []
    for prompt, ref, spec in zip(prompts, reference, speculative, strict=True):
        at = first_difference(ref, spec)
        if at is not None:
            differing.append({"id": prompt.id, "at": at, "tokens": len(ref), "tokens_with_draft": len(spec),
                              "around": _around(ref, at, tokenizer), "around_with_draft": _around(spec, at, tokenizer)})
    report = {"prompts": len(prompts), "identical": len(prompts) - len(differing), "tolerance": tolerance,
              "differing": differing}
    allowed = math.floor(tolerance * len(prompts) + 1e-9)
    if len(differing) > allowed:
        d = differing[0]
        raise LosslessError(
            f"speculative decoding with the {draft} draft changed the greedy output of {len(differing)} of {len(prompts)} "
            f"held-out prompts (evaluate.lossless_tolerance {tolerance} allows {allowed}); the first, {d['id']!r}, at output "
            f"token {d['at']} (target alone: {d['tokens']} tokens, around it {d['around']}; with the draft: "
            f"{d['tokens_with_draft']} tokens, around it {d['around_with_draft']}). Greedy speculative decoding is lossless up "
            "to floating-point numerics: this many differences is a vLLM/numerics problem, not a bad draft; check the vLLM "
            "version and dtype."
        )
    for d in differing:
        log.warning("%s draft: greedy output of prompt %r differs from the target's own from output token %d of %d "
                    "(within evaluate.lossless_tolerance %s: %d of %d prompts differ)", draft, d["id"], d["at"], d["tokens"],
                    tolerance, len(differing), len(prompts))
    return report


def _around(ids: list[int], at: int, tokenizer) -> str:
    window = list(ids[max(0, at - 8) : at + 8])
    return repr(tokenizer.decode(window)) if tokenizer else str(window)
