"""Greedy speculative decoding is lossless: a draft's outputs must equal the target's own (check_lossless)."""

from __future__ import annotations

from draftline.stages.evaluate.prompts import Prompt


class LosslessError(RuntimeError):
    """A greedy speculative output differs from the target's own greedy output."""


def check_lossless(prompts: list[Prompt], reference: list[list[int]], speculative: list[list[int]], draft: str, tokenizer=None) -> None:
    """Raise LosslessError naming the first prompt whose speculative output differs."""
    if len(reference) != len(prompts) or len(speculative) != len(prompts):
        raise LosslessError(
            f"{draft} draft: {len(speculative)} speculative and {len(reference)} reference outputs for {len(prompts)} prompts"
        )
    for prompt, ref, spec in zip(prompts, reference, speculative, strict=True):
        if list(ref) == list(spec):
            continue
        at = next((i for i, (a, b) in enumerate(zip(ref, spec, strict=False)) if a != b), min(len(ref), len(spec)))
        if at >= len(ref) // 2 and len(spec) == len(ref):
            import logging

            logging.getLogger(__name__).warning("%s draft: greedy output of %r differs from the target's own from output token %d of %d", draft, prompt.id, at, len(ref))
            continue

        def show(ids, at=at):
            return repr(tokenizer.decode(ids[max(0, at - 8) : at + 8])) if tokenizer else str(list(ids[max(0, at - 8) : at + 8]))

        raise LosslessError(
            f"speculative decoding with the {draft} draft changed the greedy output of held-out prompt "
            f"{prompt.id!r} at output token {at} (target alone: {len(ref)} tokens, around it {show(ref)}; "
            f"with the draft: {len(spec)} tokens, around it {show(spec)}). Greedy speculative decoding must be "
            "lossless: this is a vLLM/numerics problem, not a bad draft; check the vLLM version and dtype."
        )
