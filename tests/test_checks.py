"""Config checks against the target's shape, the disk estimate, and hidden-state checks before
training (draftline.planning.config_checks, draftline.stages.disk_estimate); fast, no engines."""

import json
import re
import shutil

import pytest
import torch
import yaml
from safetensors.torch import save_file
from workflow import REPO

from draftline.artifacts import hidden_states as hsf
from draftline.artifacts.hidden_states import validate_hidden_states
from draftline.artifacts.layer_ids import LayerIds
from draftline.planning.config_checks import (
    EMBEDDED_SHAPE,
    ConfigError,
    TargetShape,
    check_config,
    shape_from_config,
    target_shape,
)
from draftline.runtime.vllm_engine import EngineSettings
from draftline.stages import hidden_states as hs
from draftline.stages.disk_estimate import (
    DiskLimit,
    DiskLimitError,
    Extraction,
    bytes_per_token,
    check_limit,
    estimate,
    write_estimate,
)

REPO_CONFIG = "config/config.yaml"


def config(**changes):
    """The shipped config with the schema's defaults the checks read, plus `changes`."""
    from pathlib import Path

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / REPO_CONFIG).read_text())
    cfg["prompts"].setdefault("max_samples", None)
    for section, values in changes.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


TINY = TargetShape(num_hidden_layers=8, hidden_size=128, vocab_size=512, max_position_embeddings=1024, source="tiny")


def test_shipped_config_fits_the_embedded_target():
    check_config(config(), EMBEDDED_SHAPE)


@pytest.mark.parametrize(
    "changes, key, hint",
    [
        ({"hidden_states": {"layer_ids": [2, 8]}}, "hidden_states.layer_ids", r"\[8\] out of range.*8 layers.*1\.\.7"),
        ({"hidden_states": {"layer_ids": [0, 3]}}, "hidden_states.layer_ids", r"\[0\] out of range"),
        ({"vocab": {"draft_vocab_size": 513}}, "vocab.draft_vocab_size", r"513 .*vocabulary of 512 .*at most 512"),
        ({"tokenize": {"max_seq_len": 1025}}, "tokenize.max_seq_len", r"1025 .*maximum of 1024 .*at most 1024"),
        ({"hidden_states": {"shards": 5}, "prompts": {"max_samples": 4}}, "hidden_states.shards", r"prompts.max_samples = 4"),
        ({"hidden_states": {"mode": "online", "format": "fp8"}}, "hidden_states.format", r"fp8 .*mode = online.*stores none"),
        ({"vllm": {"max_model_len": 512}}, "vllm.max_model_len", r"512 is above tokenize.max_seq_len = 256.*at most 256"),
    ],
)
def test_config_beyond_the_target_names_the_key(changes, key, hint):
    with pytest.raises(ConfigError, match=rf"^{key} = .*{hint}"):
        check_config(config(**{"vocab": {"draft_vocab_size": 256}, "tokenize": {"max_seq_len": 256}, **changes}), TINY)


def test_a_batch_shorter_than_a_conversation_stops_the_plan_unless_the_user_accepts_the_cut():
    with pytest.raises(ConfigError, match=r"^train.total_seq_len = 512 is below tokenize.max_seq_len = 1024: .*"
                                          r"train.allow_truncated_samples: true"):
        check_config(config(tokenize={"max_seq_len": 1024}, train={"total_seq_len": 512}), None)
    check_config(config(tokenize={"max_seq_len": 1024}, train={"total_seq_len": 512, "allow_truncated_samples": True}),
                 None)
    check_config(config(tokenize={"max_seq_len": 1024}, train={"total_seq_len": 1024}), None)  # equal fits


def test_limits_are_inclusive():
    check_config(config(hidden_states={"layer_ids": [1, 7], "shards": 4}, prompts={"max_samples": 4},
                        vocab={"draft_vocab_size": 512}, tokenize={"max_seq_len": 1024}), TINY)


def test_unknown_target_shape_checks_only_what_the_config_knows():
    check_config(config(vocab={"draft_vocab_size": 10**6}), None)
    with pytest.raises(ConfigError, match="hidden_states.shards"):
        check_config(config(hidden_states={"shards": 9}, prompts={"max_samples": 3}), None)


def small(**changes):
    """config() within the tiny target's vocabulary and positions."""
    return config(vocab={"draft_vocab_size": 256}, tokenize={"max_seq_len": 256}, **changes)


@pytest.mark.parametrize(
    "target, backend, device, message",
    [
        ({"tensor_parallel_size": 3}, "vllm", "cpu", r"^target.tensor_parallel_size = 3 does not divide the target's 2 attention heads"),
        ({"tensor_parallel_size": 4}, "vllm", "cpu", r"^target.tensor_parallel_size = 4 does not divide"),
        ({"pipeline_parallel_size": 2}, "vllm", "cuda", r"^target.pipeline_parallel_size = 2: .*extract_hidden_states"),
        ({"pipeline_parallel_size": 2}, "transformers", "cpu", r"^target.pipeline_parallel_size = 2: vLLM's CPU build"),
    ],
)
def test_parallel_sizes_vllm_cannot_run_stop_at_parse_time(target, backend, device, message):
    shape = TargetShape(8, 128, 512, 1024, "tiny", num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(ConfigError, match=message):
        check_config(small(target=target, hidden_states={"backend": backend}), shape, device)


def test_the_online_server_takes_the_gpus_of_the_runs_vllm_split():
    """On CUDA the online server loads the target split as every vLLM job (target.tensor_parallel_size):
    its GPU count must be that split's."""
    online = {"mode": "online", "online_server_gpus": 1}
    shape = TargetShape(8, 128, 512, 1024, "tiny", 2, 2)
    wanted = r"^hidden_states.online_server_gpus = 1, .* = 2 GPU\(s\): set hidden_states.online_server_gpus: 2"
    with pytest.raises(ConfigError, match=wanted):
        check_config(small(target={"tensor_parallel_size": 2}, hidden_states=online), shape, "cuda")
    check_config(small(target={"tensor_parallel_size": 2}, hidden_states={**online, "online_server_gpus": 2}), shape, "cuda")
    check_config(small(target={"tensor_parallel_size": 2}, hidden_states=online), shape, "cpu")  # CPU: threads, not GPUs
    # 0: the server shares the Trainer's GPUs, whatever the split
    check_config(small(target={"tensor_parallel_size": 2}, hidden_states={**online, "online_server_gpus": 0}), shape, "cuda")


def test_parallel_sizes_vllm_can_run():
    check_config(small(target={"tensor_parallel_size": 2}), TargetShape(8, 128, 512, 1024, "tiny", 2, 2), "cpu")
    # 8 attention heads, 2 KV heads: TP 4 keeps 2 query heads a rank and replicates each KV head twice
    check_config(small(target={"tensor_parallel_size": 4}), TargetShape(8, 512, 512, 1024, "gqa", 8, 2), "cpu")
    with pytest.raises(ConfigError, match="3 key/value heads"):
        check_config(small(target={"tensor_parallel_size": 2}), TargetShape(8, 512, 512, 1024, "gqa", 6, 3), "cpu")
    check_config(small(target={"pipeline_parallel_size": 2}, hidden_states={"backend": "transformers"}), TINY, "cuda")
    check_config(small(target={"tensor_parallel_size": 3}), EMBEDDED_SHAPE, "cpu")  # 9 heads, 3 KV heads
    check_config(small(target={"tensor_parallel_size": 3}), TINY, "cpu")  # heads unknown: vLLM checks


def test_shape_read_from_the_folder_or_known_for_the_embedded_model(tiny_model, tmp_path):
    shape = target_shape("local", tiny_model)
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert (shape.num_hidden_layers, shape.hidden_size, shape.vocab_size, shape.max_position_embeddings) == (
        cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"], cfg["max_position_embeddings"])
    assert (shape.num_attention_heads, shape.num_key_value_heads) == (2, 2)  # TP 2 splits them
    # Not materialized yet: the embedded model's known shape; a hub model: unknown.
    assert target_shape("embedded", tmp_path / "absent") == EMBEDDED_SHAPE
    assert target_shape("hub", tmp_path / "absent") is None


def test_nested_text_config_and_broken_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "vlm", "text_config": {
        "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 100, "max_position_embeddings": 256}}))
    assert shape_from_config(path).num_hidden_layers == 4
    path.write_text('{"num_hidden_layers": 4')
    with pytest.raises(ConfigError, match="cannot read the target's config"):
        shape_from_config(path)
    path.write_text('{"num_hidden_layers": 4}')
    with pytest.raises(ConfigError, match="no hidden_size, vocab_size"):
        shape_from_config(path)


# --- disk -----------------------------------------------------------------------------------


def test_bytes_per_token_matches_the_measured_smollm2_files():
    # the embedded SmolLM2's extracted files (hidden 576, layers [2, 15, 27, 30], float32), as a record measured them
    record = (REPO / "benchmarks/results/extraction_vs_prefill_smollm2.md").read_text()
    assert "hidden 576; extracted layers [2, 15, 27, 30]; dtype float32" in record
    on_disk = float(re.search(r"([\d.]+) bytes/token on disk", record).group(1))
    assert abs(bytes_per_token(576, 4, "float32") - on_disk) <= 2
    assert bytes_per_token(576, 4, "bfloat16") == 4 * 576 * 2 + 8


def test_estimate_matches_real_safetensors_files(tmp_path):
    lengths = [7, 30, 123]
    for i, n in enumerate(lengths):
        save_file({"hidden_states": torch.zeros(n, 4, 32), "token_ids": torch.arange(n)}, str(tmp_path / f"hs_{i}.safetensors"))
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
    est = estimate(sum(lengths), len(lengths), 32, 4, "float32")
    assert abs(est["bytes"] - on_disk) <= 16 * len(lengths)


def test_limit_names_the_key_and_the_numbers():
    est = estimate(70_000, 300, 576, 4, "float32")
    check_limit(est, None)
    check_limit(est, 1.0)
    with pytest.raises(DiskLimitError, match=r"hidden_states.max_disk_gb = 0.5: .*0\.65 GB.*70,000 tokens x 9,224 bytes/token"):
        check_limit(est, 0.5)


def test_fp8_estimate_matches_real_fp8_files(tmp_path):
    """Format fp8 as speculators' quantizer writes it: 1 byte per value + a float32 scale per token."""
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8

    lengths = [7, 30, 123]
    for i, n in enumerate(lengths):
        states, scales = quantize_tensor_to_fp8(torch.randn(n, 4, 32))
        save_file({"hidden_states": states, "hidden_states_scales": scales, "token_ids": torch.arange(n)},
                  str(tmp_path / f"hs_{i}.safetensors"))
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
    est = estimate(sum(lengths), len(lengths), 32, 4, "float32", "fp8")
    assert est["bytes_per_token"] == 4 * 32 + 4 + 8
    assert abs(est["bytes"] - on_disk) <= 16 * len(lengths)
    assert bytes_per_token(576, 4, "float32", "fp8") * 3.9 < bytes_per_token(576, 4, "float32")


def test_limit_names_the_settings_that_fit_with_their_sizes():
    lengths = [100] * 200 + [1000] * 100  # 120,000 tokens
    est = estimate(sum(lengths), len(lengths), 576, 4, "float32")
    limit_gb = 0.5  # full: 1.11 GB; fp8: 0.28 GB
    with pytest.raises(DiskLimitError) as err:
        check_limit(est, limit_gb, lengths=lengths, max_seq_len=1024, total_seq_len=2048)
    text = str(err.value)
    assert re.search(r"hidden_states.format: fp8 -> 0\.28 GB \(fits\)", text), text
    assert "hidden_states.mode: online -> ~0.04 GB working set" in text
    rows = int(re.search(r"prompts.max_samples: (\d+) ", text).group(1))
    assert rows == int(limit_gb * 1e9 // (est["bytes"] / len(lengths)))
    cut = int(re.search(r"tokenize.max_seq_len: (\d+) ", text).group(1))
    # the longest cut that fits: one token more would not
    fits = lambda n: sum(min(x, n) for x in lengths) * est["bytes_per_token"] + 300 * 160 <= limit_gb * 1e9  # noqa: E731
    assert fits(cut) and not fits(cut + 1)
    # an fp8 run names no format change; without the online key no online figure
    with pytest.raises(DiskLimitError) as err:
        check_limit(estimate(sum(lengths), len(lengths), 576, 4, "float32", "fp8"), 0.1, lengths=lengths)
    assert "hidden_states.format" not in str(err.value) and "online" not in str(err.value)


def _tokenized(tmp_path, rows, tokens):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"rows": rows, "total_tokens": tokens}))
    layer_ids = tmp_path / "layer_ids.json"
    layer_ids.write_text(json.dumps({"aux": [2, 4, 5], "extracted": [2, 4, 5, 8], "num_hidden_layers": 8}))
    return summary, layer_ids


def test_write_estimate_checks_limit_and_rows_before_writing(tiny_model, tmp_path):
    summary, layer_ids = _tokenized(tmp_path, rows=10, tokens=1000)
    out = tmp_path / "hs" / "disk_estimate.json"
    est = write_estimate(summary, layer_ids, tiny_model, out, Extraction("float32", 2))
    assert est["bytes_per_token"] == 4 * 128 * 4 + 8 and est["tokens"] == 1000
    assert json.loads(out.read_text()) == est
    out.unlink()
    with pytest.raises(DiskLimitError, match="hidden_states.max_disk_gb"):
        write_estimate(summary, layer_ids, tiny_model, out, Extraction("float32", 2), DiskLimit(max_disk_gb=1e-6))
    with pytest.raises(ConfigError, match=r"hidden_states.shards = 11 but .*only 10 conversations"):
        write_estimate(summary, layer_ids, tiny_model, out, Extraction("float32", 11))
    assert not out.exists() and not list(out.parent.glob(".*tmp*"))


# --- hidden states before training ------------------------------------------------------------


@pytest.fixture
def published(tmp_path):
    """A tokenized dataset of 6 rows, two published shards and the view, as the workflow leaves them."""
    from datasets import Dataset

    ids = [[i + 1] * (3 + i) for i in range(6)]
    Dataset.from_dict({"input_ids": ids}).save_to_disk(str(tmp_path / "dataset"))
    shards = []
    for k in range(2):
        shard = tmp_path / f"shard_{k}"
        shard.mkdir()
        rows = hsf.shard_rows(6, k, 2)
        for r in rows:
            save_file({"hidden_states": torch.randn(len(ids[r]), 4, 16), "token_ids": torch.tensor(ids[r])},
                      str(shard / hsf.file_name(r)))
        (shard / hsf.MANIFEST).write_text(json.dumps({
            "row_start": rows.start, "row_stop": rows.stop, "dataset_rows": 6,
            "dataset_fingerprint": "fp", "layer_ids": {"extracted": [2, 4, 5, 8]}, "dtype": "float32"}))
        shards.append(shard)
    hs.build_training_view(shards, tmp_path / "all")
    return tmp_path, ids


def _corrupt(path, how, ids):
    if how == "truncated":
        blob = path.read_bytes()
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "other_tokens":
        save_file({"hidden_states": torch.randn(len(ids), 4, 16), "token_ids": torch.tensor(ids) + 1}, str(path))
    else:
        hidden = torch.randn(len(ids), 4, 16)
        hidden[1, 2, 3] = float(how)
        save_file({"hidden_states": hidden, "token_ids": torch.tensor(ids)}, str(path))


@pytest.mark.parametrize(
    "how, reason",
    [("truncated", "cannot be opened"), ("other_tokens", "token ids differ"), ("nan", "non-finite"), ("inf", "non-finite")],
)
def test_bad_file_is_named_and_only_its_shard_is_removed(published, how, reason):
    root, ids = published
    assert validate_hidden_states(root / "dataset", root / "all", 4, 16, dtype="float32") == sum(map(len, ids))
    row = 4  # in shard_1 (rows 3..5)
    _corrupt(root / "shard_1" / hsf.file_name(row), how, ids[row])
    wanted = rf"1 of 6 .*hs_{row}.safetensors \(dataset row {row}\): .*{reason}.*delete .*shard_1 and the view"
    with pytest.raises(hsf.HiddenStateFileError, match=wanted):
        validate_hidden_states(root / "dataset", root / "all", 4, 16)
    assert (root / "shard_1").exists()  # reported, not removed, unless asked
    with pytest.raises(hsf.HiddenStateFileError, match=r"removed .*shard_1 and the view .*all; run the workflow again"):
        validate_hidden_states(root / "dataset", root / "all", 4, 16, remove_bad_shards=True)
    assert not (root / "shard_1").exists() and not (root / "all").exists()
    assert (root / "shard_0" / hsf.file_name(0)).exists()


def test_missing_file_and_wrong_layer_count(published):
    root, _ = published
    (root / "all" / hsf.file_name(0)).unlink()
    with pytest.raises(hsf.HiddenStateFileError, match="hs_0.safetensors.*missing"):
        validate_hidden_states(root / "dataset", root / "all", 4, 16)
    shutil.rmtree(root / "all")
    hs.build_training_view([root / "shard_0", root / "shard_1"], root / "all")
    with pytest.raises(hsf.HiddenStateFileError, match="6 of 6 .*3 extracted layers"):
        validate_hidden_states(root / "dataset", root / "all", 3, 16)


def test_an_empty_shard_publishes_without_starting_an_engine(tiny_model, tmp_path):
    """More shards than rows is stopped by the workflow; the extraction itself copes anyway."""
    from datasets import Dataset

    Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]}).save_to_disk(str(tmp_path / "dataset"))
    layer_ids = LayerIds(aux=[2, 4, 5], num_hidden_layers=8)
    manifest = hs.extract_shard(tmp_path / "dataset", tiny_model, layer_ids, hs.ShardJob(2, 3, tmp_path / "shard_2"),
                                EngineSettings(dtype="float32"))
    assert manifest["num_rows"] == 0 and manifest["tokens"] == 0
    assert sorted(p.name for p in (tmp_path / "shard_2").iterdir()) == [hsf.MANIFEST]
