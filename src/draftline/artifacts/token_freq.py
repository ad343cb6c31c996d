"""`results/tokenized/token_freq.pt`: how often each target token id occurs in assistant turns
(speculators' `save_token_frequency_distribution` format: a dict token id -> count). Written by
tokenization; read by the vocab step and the report's coverage plot."""

from __future__ import annotations

from pathlib import Path


def read(path: str | Path) -> dict[int, int]:
    import torch

    try:
        freq = torch.load(path, weights_only=True)
    except Exception as err:  # a truncated or foreign file: say which one
        raise ValueError(f"{path}: cannot read token frequencies ({err}); rerun the tokenize step") from err
    if not isinstance(freq, dict) or not freq:
        raise ValueError(
            f"{path}: expected a non-empty dict token id -> count (speculators' token_freq.pt), "
            f"got {type(freq).__name__} of size {len(freq) if hasattr(freq, '__len__') else '?'}"
        )
    return {int(k): int(v) for k, v in freq.items()}
