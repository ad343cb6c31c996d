"""Hidden-state extraction through vLLM CPU on the tiny model, its validation, sharding and view.

Three engines are started in this module (one extraction, one resume, one extraction split
over two tensor-parallel ranks); everything else reuses their output.
"""

import json
import os
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftline.artifacts import hidden_states as hsf
from draftline.artifacts.layer_ids import LayerIds
from draftline.runtime.vllm_engine import EngineSettings
from draftline.stages import hidden_states as hs
from draftline.stages.layer_ids import resolve_layer_ids

NUM_ROWS = 6


def _layer_ids(target):
    return resolve_layer_ids("auto", str(target))


@pytest.fixture(scope="module")
def dataset(tiny_model, tmp_path_factory):
    from datasets import Dataset
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tiny_model))
    rng = random.Random(0)
    lengths = [5, 17, 33, 64, 9, 48][:NUM_ROWS]
    ids = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    path = tmp_path_factory.mktemp("data") / "dataset"
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": [[1] * n for n in lengths], "seq_len": lengths})
    ds.set_format(type="torch")  # as speculators' prepare-data saves it
    ds.save_to_disk(str(path))
    return path, ids


@pytest.fixture(scope="module")
def extracted(tiny_model, dataset, tmp_path_factory):
    """One real extraction (vLLM CPU, eager) of all rows as shard 0 of 1."""
    root = tmp_path_factory.mktemp("hs")
    manifest = hs.extract_shard(dataset[0], tiny_model, _layer_ids(tiny_model), hs.ShardJob(0, 1, root / "shard_0"),
                                EngineSettings(dtype="float32", threads=1, enforce_eager=True),
                                hs.ExtractionSettings(rows_per_call=4))
    return root, manifest


@pytest.mark.dag
def test_extraction_files_shapes_dtypes_and_manifest(tiny_model, dataset, extracted):
    root, manifest = extracted
    _, ids = dataset
    layers = _layer_ids(tiny_model).extracted
    shard = root / "shard_0"
    assert sorted(p.name for p in shard.iterdir()) == sorted(
        [hsf.MANIFEST] + [hsf.file_name(i) for i in range(NUM_ROWS)]
    )
    for i, row in enumerate(ids):
        data = load_file(shard / hsf.file_name(i))
        assert data["hidden_states"].shape == (len(row), len(layers), 128)
        assert data["hidden_states"].dtype == torch.float32
        assert data["token_ids"].tolist() == row
        assert torch.isfinite(data["hidden_states"]).all()
        # Every layer is its own tensor, not a copy of another.
        for a in range(len(layers) - 1):
            assert not torch.allclose(data["hidden_states"][:, a], data["hidden_states"][:, a + 1])
    assert manifest["num_rows"] == NUM_ROWS and manifest["tokens"] == sum(map(len, ids))
    assert manifest["layer_ids"]["extracted"] == layers
    assert manifest["extracted_rows"] == NUM_ROWS and manifest["tokens_per_s"] > 0
    # where the extraction's seconds went (rows_per_call 4: two chunks, the last one's files apart)
    phases = manifest["extract_seconds_by_phase"]
    assert set(phases) == {"prefill", "waiting_for_files", "last_chunk_files"}
    assert phases["prefill"] > 0 and min(phases.values()) >= 0
    assert sum(phases.values()) == pytest.approx(manifest["extract_seconds"], abs=0.1)
    assert manifest["bytes"] == sum(
        (shard / hsf.file_name(i)).stat().st_size for i in range(NUM_ROWS)
    )
    assert json.loads((shard / hsf.MANIFEST).read_text()) == manifest
    # Nothing is left behind: no lock files, the staging folder is gone.
    assert not list(root.rglob("*.lock"))
    assert not list((root / ".staging").glob("shard_0-*"))


@pytest.mark.dag
def test_states_match_transformers_forward(tiny_model, dataset, extracted):
    """vLLM id i == transformers hidden_states[i] for i < n; id n is the last layer before the
    final norm (transformers' hidden_states[n] is after it)."""
    from transformers import AutoModelForCausalLM

    root, _ = extracted
    _, ids = dataset
    layers = _layer_ids(tiny_model).extracted
    n = layers[-1]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda mod, inp, out: captured.__setitem__("last", out[0] if isinstance(out, tuple) else out)
    )
    try:
        for i in (0, 3, 5):
            got = load_file(root / "shard_0" / hsf.file_name(i))["hidden_states"]
            with torch.no_grad():
                ref = model(torch.tensor([ids[i]]), output_hidden_states=True).hidden_states
            for j, layer in enumerate(layers[:-1]):
                torch.testing.assert_close(got[:, j], ref[layer][0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got[:, -1], captured["last"][0], rtol=1e-4, atol=1e-4)
            with torch.no_grad():
                normed = model.model.norm(got[:, -1])
            torch.testing.assert_close(normed, ref[n][0], rtol=1e-4, atol=1e-4)
    finally:
        hook.remove()


# TP 2 vs unsplit, float32: measured max |difference| 8.2e-8, 1.4e-7, 1.8e-7, 2.5e-7 on layers
# 2, 4, 5, 8 of these rows (values up to ~0.4): the split sums in another order, nothing more.
SPLIT_ATOL = 2e-6


@pytest.fixture(scope="module")
def extracted_split(tiny_model, dataset, tmp_path_factory):
    """The same rows extracted with target.tensor_parallel_size 2 (two vLLM CPU workers)."""
    root = tmp_path_factory.mktemp("hs-tp2")
    manifest = hs.extract_shard(dataset[0], tiny_model, _layer_ids(tiny_model), hs.ShardJob(0, 1, root / "shard_0"),
                                EngineSettings(dtype="float32", threads=2, enforce_eager=True, tensor_parallel_size=2),
                                hs.ExtractionSettings(rows_per_call=4))
    return root, manifest


@pytest.mark.dag
def test_tensor_parallel_states_match_unsplit_on_every_layer(tiny_model, dataset, extracted, extracted_split):
    (whole, _), (split, manifest) = extracted, extracted_split
    _, ids = dataset
    layers = _layer_ids(tiny_model).extracted
    assert manifest["tensor_parallel_size"] == 2 and manifest["num_rows"] == NUM_ROWS
    assert manifest["staging_key"] != json.loads((whole / "shard_0" / hsf.MANIFEST).read_text())["staging_key"]
    for i, row in enumerate(ids):
        # one rank wrote every captured layer, not one layer or one rank's share of the hidden size
        hsf.validate_hidden_state_file(split / "shard_0" / hsf.file_name(i), row, len(layers), 128, row=i, dtype="float32")
        a = load_file(whole / "shard_0" / hsf.file_name(i))["hidden_states"]
        b = load_file(split / "shard_0" / hsf.file_name(i))["hidden_states"]
        for j, layer in enumerate(layers):
            torch.testing.assert_close(b[:, j], a[:, j], rtol=0, atol=SPLIT_ATOL,
                                       msg=lambda m, i=i, layer=layer: f"row {i} layer {layer}: {m}")


@pytest.mark.dag
def test_resume_skips_validated_staged_rows(tiny_model, dataset, extracted, tmp_path):
    """A killed job's staged files are reused (same inode ends up published); broken ones redone."""
    root, _ = extracted
    path, ids = dataset
    from datasets import load_from_disk

    engine = EngineSettings(dtype="float32", threads=1, enforce_eager=True)
    key = hs.staging_key(hs.staging_record(
        tiny_model, _layer_ids(tiny_model).extracted, load_from_disk(str(path))._fingerprint, engine,
        hs.ExtractionSettings(),
    ))
    staging = tmp_path / ".staging" / f"shard_0-{key}"
    staging.mkdir(parents=True)
    for i in (0, 1, 2, 4):
        shutil.copy(root / "shard_0" / hsf.file_name(i), staging / hsf.file_name(i))
    # Row 3: truncated by the kill. Row 5: missing. A folder from other settings is dropped.
    blob = (root / "shard_0" / hsf.file_name(3)).read_bytes()
    (staging / hsf.file_name(3)).write_bytes(blob[: len(blob) // 2])
    other = tmp_path / ".staging" / "shard_0-0000000000000000"
    other.mkdir()
    inodes = {i: (staging / hsf.file_name(i)).stat().st_ino for i in (0, 1, 2, 4)}

    manifest = hs.extract_shard(path, tiny_model, _layer_ids(tiny_model), hs.ShardJob(0, 1, tmp_path / "shard_0"),
                                engine)
    assert manifest["reused_rows"] == 4 and manifest["extracted_rows"] == 2
    for i, ino in inodes.items():
        assert (tmp_path / "shard_0" / hsf.file_name(i)).stat().st_ino == ino
    for i in range(NUM_ROWS):
        hsf.validate_hidden_state_file(tmp_path / "shard_0" / hsf.file_name(i), ids[i], 4, 128, row=i)
    assert not other.exists() and not staging.exists()


def _key(target, engine=EngineSettings(dtype="float32"), extraction=None, layers=(2, 4, 5, 8), dataset="fp"):
    return hs.staging_key(hs.staging_record(target, layers, dataset, engine, extraction or hs.ExtractionSettings()))


def test_staging_key_follows_every_setting_the_rule_follows(tiny_model):
    """What changes the shard rule's params changes the staging key; what changes only speed does not."""
    from dataclasses import replace

    from draftline.runtime.vllm_engine import OUTPUT_FIELDS

    base = _key(tiny_model)
    assert base == _key(tiny_model)
    engine, extraction = EngineSettings(dtype="float32"), hs.ExtractionSettings()
    changed = {
        "layers": _key(tiny_model, layers=(1, 4, 5, 8)), "dataset": _key(tiny_model, dataset="other"),
        "dtype": _key(tiny_model, replace(engine, dtype="bfloat16")),
        "tensor parallel": _key(tiny_model, replace(engine, tensor_parallel_size=2)),
        "trust_remote_code": _key(tiny_model, replace(engine, trust_remote_code=True)),
        "format": _key(tiny_model, extraction=replace(extraction, format="fp8")),
        "backend": _key(tiny_model, extraction=replace(extraction, backend="transformers")),
        "options": _key(tiny_model, extraction=replace(extraction, options={"batch_tokens": 8})),
        "code": _key(tiny_model, extraction=replace(extraction, plan_key={"code": "abc"})),
    }
    # every vllm.* key the schema marks output-changing (extraction sizes its own context)
    values = {"quantization": "fp8", "kv_cache_dtype": "fp8", "engine_args": {"block_size": 32}}
    for name in set(OUTPUT_FIELDS) - {"max_model_len"}:
        changed[name] = _key(tiny_model, replace(engine, **{name: values[name]}))
    assert [name for name, key in changed.items() if key == base] == []
    # speed only: the same key (the staged files stay reusable)
    for speed in ({"max_num_seqs": 4}, {"gpu_memory_utilization": 0.5}, {"cpu_kv_cache_gib": 3},
                  {"enforce_eager": True}, {"threads": 2}, {"max_model_len": 99}):
        assert _key(tiny_model, replace(engine, **speed)) == base, speed
    # the transformers backend ignores vLLM's split, as the rule's `parallel` param does
    hf = replace(extraction, backend="transformers")
    assert _key(tiny_model, replace(engine, tensor_parallel_size=2), hf) == _key(tiny_model, engine, hf)


class Killed(BaseException):
    """What a kill of the job looks like from inside extract_shard."""


class _QuantizationMarked:
    """A backend whose states carry the engine's quantization (offset 0 unquantized, 100 for fp8),
    killed after `kill_after` rows (the rows before it are staged)."""

    name = "vllm"
    OFFSET = {None: 0.0, "fp8": 100.0}

    def __init__(self, kill_after=None):
        self.kill_after = kill_after

    def extract(self, request):
        for n, row in enumerate(request.rows):
            if n == self.kill_after:
                raise Killed
            ids = request.token_ids[row]
            states = torch.randn(len(ids), len(request.extracted), request.hidden_size,
                                 generator=torch.Generator().manual_seed(row))
            _write(request.dest / hsf.file_name(row), states + self.OFFSET[request.engine.quantization], ids)
        return hs.backends.Extracted(sum(len(request.token_ids[r]) for r in request.rows), 0.0, 1.0)


def test_a_shard_killed_and_resumed_under_another_quantization_holds_only_the_new_ones(
        tiny_model, dataset, tmp_path, monkeypatch):
    """Killed after 3 rows unquantized, resumed with vllm.quantization fp8: every published row is
    fp8's (before, the 3 staged rows were reused: one shard of two quantizations)."""
    path, _ = dataset
    job = hs.ShardJob(0, 1, tmp_path / "shard_0")
    plain = EngineSettings(dtype="float32", threads=1)
    extraction = hs.ExtractionSettings(fidelity=hs.fidelity_check.FidelitySettings(rows=0))
    monkeypatch.setattr(hs.backends, "get", lambda name: _QuantizationMarked(kill_after=3))
    with pytest.raises(Killed):
        hs.extract_shard(path, tiny_model, _layer_ids(tiny_model), job, plain, extraction)
    assert len(list((tmp_path / ".staging").glob("shard_0-*/hs_*.safetensors"))) == 3

    monkeypatch.setattr(hs.backends, "get", lambda name: _QuantizationMarked())
    from dataclasses import replace

    manifest = hs.extract_shard(path, tiny_model, _layer_ids(tiny_model), job, replace(plain, quantization="fp8"),
                                extraction)
    assert manifest["reused_rows"] == 0 and manifest["extracted_rows"] == NUM_ROWS
    means = [float(load_file(job.out_dir / hsf.file_name(r))["hidden_states"].mean()) for r in range(NUM_ROWS)]
    assert all(m > 50 for m in means), means


def test_a_shard_killed_and_resumed_with_the_same_settings_reuses_its_staged_rows(
        tiny_model, dataset, tmp_path, monkeypatch):
    path, _ = dataset
    job = hs.ShardJob(0, 1, tmp_path / "shard_0")
    engine = EngineSettings(dtype="float32", threads=1, quantization="fp8")
    extraction = hs.ExtractionSettings(fidelity=hs.fidelity_check.FidelitySettings(rows=0))
    monkeypatch.setattr(hs.backends, "get", lambda name: _QuantizationMarked(kill_after=3))
    with pytest.raises(Killed):
        hs.extract_shard(path, tiny_model, _layer_ids(tiny_model), job, engine, extraction)
    monkeypatch.setattr(hs.backends, "get", lambda name: _QuantizationMarked())
    manifest = hs.extract_shard(path, tiny_model, _layer_ids(tiny_model), job, engine, extraction)
    assert manifest["reused_rows"] == 3 and manifest["extracted_rows"] == NUM_ROWS - 3


def _write(path, hidden, tokens):
    save_file({"hidden_states": hidden, "token_ids": torch.tensor(tokens)}, str(path))


def test_validation_catches_broken_files(tmp_path):
    ids = [5, 6, 7, 8]
    good = tmp_path / "hs_7.safetensors"
    _write(good, torch.randn(4, 3, 16), ids)
    assert hsf.validate_hidden_state_file(good, ids, 3, 16, row=7) == 4

    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(hsf.HiddenStateFileError, match=r"truncated.safetensors \(dataset row 7\).*cannot be opened"):
        hsf.validate_hidden_state_file(truncated, ids, 3, 16, row=7)
    with pytest.raises(hsf.HiddenStateFileError, match="missing"):
        hsf.validate_hidden_state_file(tmp_path / "absent.safetensors", ids, 3, 16, row=7)
    with pytest.raises(hsf.HiddenStateFileError, match="first difference at position 2"):
        hsf.validate_hidden_state_file(good, [5, 6, 9, 8], 3, 16, row=7)
    with pytest.raises(hsf.HiddenStateFileError, match="token ids differ"):
        hsf.validate_hidden_state_file(good, ids[:3], 3, 16, row=7)
    # wrong layer count, hidden size, dtype: the message names the file, its row and what is wrong
    where = r"hs_7.safetensors \(dataset row 7\): "
    wanted = where + r"hidden_states has shape \(4, 3, 16\), expected \[4, 4, 16\] \(4 extracted layers\)"
    with pytest.raises(hsf.HiddenStateFileError, match=wanted):
        hsf.validate_hidden_state_file(good, ids, 4, 16, row=7)
    with pytest.raises(hsf.HiddenStateFileError, match=where + r"hidden_states has shape \(4, 3, 16\), expected \[4, 3, 32\]"):
        hsf.validate_hidden_state_file(good, ids, 3, 32, row=7)
    with pytest.raises(hsf.HiddenStateFileError, match=where + "hidden_states dtype torch.float32, expected bfloat16"):
        hsf.validate_hidden_state_file(good, ids, 3, 16, row=7, dtype="bfloat16")
    # one layer's tensor instead of the captured layers (the failure seen with distributed workers)
    one_layer = tmp_path / "hs_8.safetensors"
    _write(one_layer, torch.randn(4, 16), ids)
    wanted = r"hs_8.safetensors \(dataset row 8\): hidden_states has shape \(4, 16\), expected \[seq_len, layers, hidden\]"
    with pytest.raises(hsf.HiddenStateFileError, match=wanted):
        hsf.validate_hidden_state_file(one_layer, ids, 3, 16, row=8)
    for bad_value in (float("nan"), float("inf")):
        bad = tmp_path / "bad.safetensors"
        hidden = torch.randn(4, 3, 16)
        hidden[2, 1, 5] = bad_value
        _write(bad, hidden, ids)
        with pytest.raises(hsf.HiddenStateFileError, match="non-finite"):
            hsf.validate_hidden_state_file(bad, ids, 3, 16, row=7)
    short = tmp_path / "short.safetensors"
    _write(short, torch.randn(3, 3, 16), ids)
    with pytest.raises(hsf.HiddenStateFileError, match="doesn't match num tokens"):
        hsf.validate_hidden_state_file(short, ids, 3, 16, row=7)


@pytest.mark.parametrize("num_rows,n", [(10, 3), (2, 5), (0, 2), (7, 1), (100, 7)])
def test_shards_cover_every_row_once(num_rows, n):
    ranges = [hsf.shard_rows(num_rows, k, n) for k in range(n)]
    rows = [r for rg in ranges for r in rg]
    assert rows == list(range(num_rows))
    sizes = [len(rg) for rg in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_shard_index_out_of_range():
    with pytest.raises(ValueError, match="shard 3 of 3"):
        hsf.shard_rows(10, 3, 3)


def _fake_shard(root, k, n, num_rows, extracted=(2, 4)):
    d = root / f"shard_{k}"
    d.mkdir()
    rows = hsf.shard_rows(num_rows, k, n)
    for r in rows:
        _write(d / hsf.file_name(r), torch.zeros(2, len(extracted), 8), [1, 2])
    (d / hsf.MANIFEST).write_text(json.dumps({
        "row_start": rows.start, "row_stop": rows.stop, "dataset_rows": num_rows,
        "dataset_fingerprint": "fp", "layer_ids": {"extracted": list(extracted)}, "dtype": "float32",
    }))
    return d


def test_view_links_every_row_once(tmp_path):
    shards = [_fake_shard(tmp_path, k, 3, 8) for k in range(3)]
    hs.build_training_view(shards, tmp_path / "all")
    links = sorted((tmp_path / "all").glob("hs_*.safetensors"), key=lambda p: int(p.stem[3:]))
    assert [p.name for p in links] == [hsf.file_name(i) for i in range(8)]
    for p in links:
        assert p.is_symlink() and not os.path.isabs(os.readlink(p))
        assert load_file(p)["token_ids"].tolist() == [1, 2]
    # The links stay valid when results/ moves as a whole.
    shutil.move(tmp_path, tmp_path.parent / "moved")
    try:
        assert load_file(tmp_path.parent / "moved" / "all" / hsf.file_name(7))["token_ids"].tolist() == [1, 2]
    finally:
        shutil.move(tmp_path.parent / "moved", tmp_path)


def test_view_rejects_missing_and_duplicate_rows(tmp_path):
    s0 = _fake_shard(tmp_path, 0, 2, 6)
    with pytest.raises(ValueError, match="3 of 6 dataset rows are in no shard"):
        hs.build_training_view([s0], tmp_path / "all")
    with pytest.raises(ValueError, match="dataset row 0 is in two shards"):
        hs.build_training_view([s0, s0], tmp_path / "all")
    s1 = _fake_shard(tmp_path, 1, 2, 6, extracted=(1, 4))
    with pytest.raises(ValueError, match="another dataset, layer setting or format"):
        hs.build_training_view([s0, s1], tmp_path / "all")
    (s0 / hsf.file_name(1)).unlink()
    with pytest.raises(FileNotFoundError, match="hs_1.safetensors is missing"):
        hs.build_training_view([s0], tmp_path / "all")
    assert not (tmp_path / "all").exists()


@pytest.mark.dag
def test_trainer_reads_the_view(dataset, extracted):
    """speculators' own training dataset loads every row through the view."""
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    root, _ = extracted
    path, ids = dataset
    view = root / "all"
    hs.build_training_view([root / "shard_0"], view)
    assert len(list(view.glob("hs_*.safetensors"))) == NUM_ROWS
    assert os.readlink(view / hsf.file_name(0)) == os.path.join("..", "shard_0", hsf.file_name(0))
    data = ArrowDataset(
        max_len=256, datapath=str(path), transfer=FileTransfer(view), on_missing="raise",
        hidden_states_dtype=torch.float32,
    )
    for i in range(NUM_ROWS):
        item = data[i]
        assert item["input_ids"].tolist() == ids[i]
        assert item["hidden_states"].shape == (len(ids[i]), 3 * 128)  # the three aux layers
        assert item["verifier_last_hidden_states"].shape == (len(ids[i]), 128)


def test_layer_ids_from_another_target_are_rejected(tiny_model, tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"input_ids": [[1, 2, 3]]}).save_to_disk(str(tmp_path / "dataset"))
    with pytest.raises(ValueError, match="rerun the layer_ids rule"):
        hs.extract_shard(tmp_path / "dataset", tiny_model, LayerIds(aux=[2], num_hidden_layers=30), hs.ShardJob(0, 1, tmp_path / "shard_0"))


# --- hidden_states.format fp8 ------------------------------------------------------------------

# float8_e4m3fn keeps 3 mantissa bits: at most 2^-4 relative error per value at the per-token
# scale, a few percent in norm (measured on this model: benchmarks/results/hidden_state_modes.md, its Supersedes).
FP8_MAX_RELATIVE_ERROR = 0.05


@pytest.fixture(scope="module")
def extracted_fp8(tiny_model, dataset, tmp_path_factory):
    """The same rows extracted in format fp8 (vLLM CPU with CPUFP8HiddenStatesConnector)."""
    root = tmp_path_factory.mktemp("hs_fp8")
    manifest = hs.extract_shard(dataset[0], tiny_model, _layer_ids(tiny_model), hs.ShardJob(0, 1, root / "shard_0"),
                                EngineSettings(dtype="float32", threads=1, enforce_eager=True),
                                hs.ExtractionSettings(rows_per_call=4, format="fp8"))
    return root, manifest


def _fp8_errors(full_root, fp8_root, ids):
    """Per-layer relative error of fp8 states (as speculators' reader returns them) over all rows."""
    full = torch.cat([hsf.read_states(full_root / hsf.file_name(i)) for i in range(len(ids))])
    fp8 = torch.cat([hsf.read_states(fp8_root / hsf.file_name(i), "fp8") for i in range(len(ids))])
    return hsf.relative_error_per_layer(full, fp8)


@pytest.mark.dag
def test_fp8_files_are_speculators_layout_and_close_to_full_precision(dataset, extracted, extracted_fp8):
    from hs_connectors.transfer import FP8Transfer
    from speculators.train.data import ArrowDataset

    root, manifest = extracted_fp8
    path, ids = dataset
    shard = root / "shard_0"
    assert manifest["format"] == "fp8" and extracted[1]["format"] == "full"
    # one byte per value + a float32 scale per token, against float32: about 4x smaller
    assert manifest["bytes"] * 3.5 < extracted[1]["bytes"]
    for i, row in enumerate(ids):
        data = load_file(shard / hsf.file_name(i))
        assert data["hidden_states"].dtype == torch.float8_e4m3fn
        assert data["hidden_states"].shape == (len(row), 4, 128)
        assert data["hidden_states_scales"].shape == (len(row), 1, 1)
        assert data["token_ids"].tolist() == row
    errors = _fp8_errors(extracted[0] / "shard_0", shard, ids)
    assert len(errors) == 4 and all(0 < e < FP8_MAX_RELATIVE_ERROR for e in errors), errors
    # speculators' Trainer dataset reads them through its own fp8 backend
    hs.build_training_view([shard], root / "all")
    assert json.loads((root / "all" / hsf.MANIFEST).read_text())["format"] == "fp8"
    data = ArrowDataset(max_len=256, datapath=str(path), transfer=FP8Transfer(root / "all"), on_missing="raise",
                        hidden_states_dtype=torch.float32)
    item = data[3]
    assert item["hidden_states"].shape == (len(ids[3]), 3 * 128)
    assert torch.isfinite(item["hidden_states"].float()).all()


@pytest.mark.dag
def test_transformers_backend_writes_fp8_too(tiny_model, dataset, extracted, tmp_path):
    path, ids = dataset
    manifest = hs.extract_shard(path, tiny_model, _layer_ids(tiny_model), hs.ShardJob(0, 1, tmp_path / "shard_0"),
                                EngineSettings(dtype="float32", threads=1),
                                hs.ExtractionSettings(backend="transformers", format="fp8"))
    assert manifest["format"] == "fp8" and manifest["backend"] == "transformers"
    errors = _fp8_errors(extracted[0] / "shard_0", tmp_path / "shard_0", ids)
    assert all(e < FP8_MAX_RELATIVE_ERROR for e in errors), errors


def test_fp8_validation_catches_broken_files(tmp_path):
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8

    ids = [3, 1, 4, 1, 5]
    states, scales = quantize_tensor_to_fp8(torch.randn(5, 4, 8))
    good = {"hidden_states": states, "hidden_states_scales": scales, "token_ids": torch.tensor(ids)}

    def check(tensors, format="fp8", row_ids=ids):
        path = tmp_path / "hs_0.safetensors"
        save_file(tensors, str(path))
        return hsf.validate_hidden_state_file(path, row_ids, 4, 8, row=0, dtype="float32", format=format)

    assert check(good) == 5
    bad_scales = scales.clone()
    bad_scales[2] = float("nan")
    nan_value = states.view(torch.uint8).clone()
    nan_value[1, 2, 3] = 0x7F  # float8_e4m3fn's NaN
    cases = [
        ({**good, "hidden_states_scales": bad_scales}, "fp8", ids, "non-finite or non-positive scales"),
        ({**good, "hidden_states_scales": scales[:4]}, "fp8", ids, r"expected float32 \[5, 1, 1\]"),
        ({"hidden_states": states, "token_ids": torch.tensor(ids)}, "fp8", ids, "not an fp8 hidden-state file"),
        ({**good, "hidden_states": nan_value.view(torch.float8_e4m3fn)}, "fp8", ids, "non-finite values"),
        (good, "fp8", [3, 1, 4, 1, 6], "token ids differ"),
        (good, "full", ids, "an fp8 file .* where format full is expected"),
        ({"hidden_states": torch.zeros(5, 4, 8), "token_ids": torch.tensor(ids)}, "fp8", ids,
         "not an fp8 hidden-state file"),
    ]
    for tensors, format, row_ids, message in cases:
        with pytest.raises(hsf.HiddenStateFileError, match=message):
            check(tensors, format, row_ids)


def test_extraction_times_say_whether_the_files_or_the_engine_held_it_up(tmp_path):
    """run_chunks splits its seconds into the engine's calls, the wait for an earlier chunk's files
    (a finish slower than the next prefill) and the last chunk's files (nothing overlaps them): what
    a user reads in the manifest when extraction runs below plain prefill."""
    import time

    from draftline.backends.vllm import run_chunks

    class SlowFiles:  # each engine call 0.05 s, each chunk's files 0.15 s
        def generate(self, ids):
            time.sleep(0.05)
            return ids

        def finish(self, rows, ids, outputs, dest):
            time.sleep(0.15)
            return sum(map(len, ids))

    rows = list(range(8))
    t0 = time.perf_counter()
    times = run_chunks(SlowFiles(), rows, {r: [1] * (r + 1) for r in rows}, tmp_path, chunk_rows=2)
    wall = time.perf_counter() - t0
    assert times.tokens == sum(r + 1 for r in rows)
    assert times.prefill == pytest.approx(4 * 0.05, abs=0.04)
    # chunks 2-4 each waited for the one before it: 0.15 s of files less the 0.05 s prefill beside them
    assert times.waiting_for_files == pytest.approx(3 * 0.10, abs=0.06)
    assert times.last_chunk_files == pytest.approx(0.15, abs=0.04)
    assert sum(times.by_phase().values()) == pytest.approx(wall, abs=0.03)

    class FastFiles(SlowFiles):  # files faster than the next prefill: no wait but the last chunk's
        def finish(self, rows, ids, outputs, dest):
            time.sleep(0.01)
            return sum(map(len, ids))

    fast = run_chunks(FastFiles(), rows, {r: [1] for r in rows}, tmp_path, chunk_rows=2)
    assert fast.waiting_for_files < 0.02 and fast.last_chunk_files == pytest.approx(0.01, abs=0.02)
