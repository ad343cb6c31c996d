"""The draft's reduced vocabulary: d2t/t2d maps from the assistant-token frequencies.

The maps are built by speculators' own builder and saved the way its trainer loads
`--d2t-path/--t2d-path` (`np.load` -> `torch.from_numpy`): d2t int64 [draft_vocab] holds
offsets (target id = draft index + d2t[draft index]); t2d bool [target_vocab] marks the
target ids the draft can propose.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np

from draftline.artifacts import token_freq as token_freq_file
from draftline.artifacts.target import vocab_size as target_vocab_size
from draftline.runtime.atomic import atomic_file
from draftline.settings.target_shape import check_draft_vocab

log = logging.getLogger(__name__)


def build_vocab_maps(
    token_freq: dict[int, int], draft_vocab_size: int, target_vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d) as numpy arrays, via speculators' builder (most frequent tokens win)."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    check_draft_vocab(draft_vocab_size, target_vocab, "the target's config")
    out_of_range = sorted(t for t in token_freq if not 0 <= t < target_vocab)
    if out_of_range:
        raise ValueError(
            f"token frequencies hold ids outside the target's vocabulary 0..{target_vocab - 1} "
            f"(e.g. {out_of_range[:5]}): the tokenized data was made with another tokenizer; "
            "rerun the tokenize step for this target"
        )
    d2t, t2d = build_vocab_mappings_from_distribution(
        token_freq_dict=token_freq, draft_vocab_size=draft_vocab_size, target_vocab_size=target_vocab
    )
    return d2t.numpy(), t2d.numpy()


def coverage_summary(token_freq: dict[int, int], d2t: np.ndarray, t2d: np.ndarray) -> dict:
    selected = d2t + np.arange(len(d2t))
    total = sum(token_freq.values())
    covered = sum(c for t, c in token_freq.items() if t2d[t])
    seen = sum(1 for t in selected.tolist() if token_freq.get(t, 0) > 0)
    return {
        "draft_vocab_size": int(len(d2t)),
        "target_vocab_size": int(len(t2d)),
        "assistant_tokens": int(total),
        "assistant_tokens_covered": int(covered),
        # Share of assistant (trained) tokens the draft can propose at all.
        "coverage": covered / total if total else 0.0,
        "distinct_assistant_tokens": len(token_freq),
        # Draft slots filled with unseen low ids when the data has fewer distinct tokens.
        "draft_tokens_never_seen": int(len(d2t) - seen),
    }


def _save_npy(path: Path, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    with atomic_file(path, "wb") as handle:
        handle.write(buf.getvalue())


def write_vocab(
    token_freq_path: str | Path,
    target_dir: str | Path,
    draft_vocab_size: int,
    d2t_path: str | Path,
    t2d_path: str | Path,
    summary_path: str | Path,
    trust_remote_code: bool = False,
) -> dict:
    """Build and publish d2t.npy, t2d.npy and summary.json; return the summary."""
    freq = token_freq_file.read(token_freq_path)
    target_vocab = target_vocab_size(target_dir, trust_remote_code)
    d2t, t2d = build_vocab_maps(freq, draft_vocab_size, target_vocab)
    # The same invariants speculators' load_vocab_mappings enforces, checked before publishing.
    selected = d2t + np.arange(len(d2t))
    if not (
        d2t.dtype == np.int64
        and t2d.dtype == np.bool_
        and int(t2d.sum()) == draft_vocab_size
        and bool(np.all(t2d[selected]))
    ):
        raise RuntimeError("speculators' vocab builder returned inconsistent d2t/t2d maps")
    summary = coverage_summary(freq, d2t, t2d)
    log.info(
        "draft vocab %d of %d target tokens covers %.1f%% of %d assistant tokens (%d distinct)",
        summary["draft_vocab_size"],
        summary["target_vocab_size"],
        100 * summary["coverage"],
        summary["assistant_tokens"],
        summary["distinct_assistant_tokens"],
    )
    _save_npy(Path(d2t_path), d2t)
    _save_npy(Path(t2d_path), t2d)
    with atomic_file(summary_path) as out:
        json.dump(summary, out, indent=1)
        out.write("\n")
    return summary
