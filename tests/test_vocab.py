"""d2t/t2d maps from assistant-token frequencies, in the form speculators' trainer loads."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

TEXTS = [
    "The sea is wide and blue and deep.",
    "The capital of France is Paris.",
    "A draft model proposes tokens; the target verifies them.",
    "Numbers: 1 2 3 4 5. Math: 2 + 2 = 4.",
]


@pytest.fixture(scope="module")
def token_freq(tiny_model, tmp_path_factory):
    """speculators' token_freq.pt over the assistant tokens of a small chat dataset."""
    from datasets import Dataset
    from speculators.train.vocab_mapping import save_token_frequency_distribution
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids, masks = [], []
    for i, text in enumerate(TEXTS * 3):
        conv = [{"role": "user", "content": f"Say something ({i})."}, {"role": "assistant", "content": text}]
        n_prompt = len(tok(tok.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True))["input_ids"])
        full = tok(tok.apply_chat_template(conv, tokenize=False))["input_ids"]
        ids.append(full)
        masks.append([0] * n_prompt + [1] * (len(full) - n_prompt))
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": masks, "seq_len": [len(x) for x in ids]})
    ds.set_format("torch")
    path = tmp_path_factory.mktemp("tokenized") / "token_freq.pt"
    save_token_frequency_distribution(ds, path)
    expected = Counter(t for row, mask in zip(ids, masks) for t, m in zip(row, mask) if m)
    return path, expected


def _write(tiny_model, token_freq_path, size, tmp_path):
    from draftline.stages.vocab import write_vocab

    out = tmp_path / "vocab"
    summary = write_vocab(token_freq_path, tiny_model, size, out / "d2t.npy", out / "t2d.npy", out / "summary.json")
    return np.load(out / "d2t.npy"), np.load(out / "t2d.npy"), summary, out


def test_maps_select_the_most_frequent_assistant_tokens(tiny_model, token_freq, tmp_path):
    path, counts = token_freq
    size = 16
    d2t, t2d, summary, out = _write(tiny_model, path, size, tmp_path)
    # The dtypes speculators itself writes (np.save of int64 / bool tensors).
    assert d2t.dtype == np.int64 and d2t.shape == (size,)
    assert t2d.dtype == np.bool_ and t2d.shape == (512,)
    selected = d2t + np.arange(size)
    assert list(selected) == sorted(set(selected.tolist()))  # sorted target ids, no repeats
    assert int(t2d.sum()) == size and list(np.flatnonzero(t2d)) == list(selected)
    # Every token at least as frequent as the 16th most frequent one would be in, bar ties.
    threshold = sorted(counts.values(), reverse=True)[size - 1]
    assert {t for t, c in counts.items() if c > threshold} <= set(selected.tolist())
    covered = sum(c for t, c in counts.items() if t2d[t])
    assert summary["coverage"] == pytest.approx(covered / sum(counts.values()))
    assert summary["assistant_tokens"] == sum(counts.values())
    assert (summary["draft_vocab_size"], summary["target_vocab_size"]) == (size, 512)
    assert json.loads((out / "summary.json").read_text()) == summary


def test_maps_load_as_speculators_trainer_loads_them(tiny_model, token_freq, tmp_path):
    from speculators.train.cli import _load_mappings

    _d2t, _t2d, _summary, out = _write(tiny_model, token_freq[0], 16, tmp_path)
    d2t, t2d, size = _load_mappings(out / "d2t.npy", out / "t2d.npy", 16)
    assert size == 16 and str(d2t.dtype) == "torch.int64" and str(t2d.dtype) == "torch.bool"


def test_draft_vocab_larger_than_seen_tokens_still_has_its_size(tiny_model, token_freq, tmp_path):
    path, counts = token_freq
    size = len(counts) + 10
    _d2t, t2d, summary, _out = _write(tiny_model, path, size, tmp_path)
    assert int(t2d.sum()) == size
    assert summary["coverage"] == 1.0 and summary["draft_tokens_never_seen"] == 10


def test_draft_vocab_larger_than_target_is_a_clear_error(tiny_model, token_freq, tmp_path):
    with pytest.raises(ValueError, match=r"vocab.draft_vocab_size = 600 .* 512 tokens"):
        _write(tiny_model, token_freq[0], 600, tmp_path)
    assert not (tmp_path / "vocab" / "d2t.npy").exists()


def test_token_ids_outside_the_target_vocab_are_rejected(tiny_model, tmp_path):
    import torch

    path = tmp_path / "token_freq.pt"
    torch.save({5: 3, 9000: 1}, path)
    with pytest.raises(ValueError, match="another tokenizer"):
        _write(tiny_model, path, 8, tmp_path)
