"""The hidden-state fidelity check (draftline.fidelity) catches states that are not the target's.

Right states come from a transformers forward of rows whose answers the target wrote greedily
(vLLM's layer id i = transformers' hidden_states[i]; the last id is the final norm's input, as
the transformers backend stores it); each failure is injected into them: all zeros, the layer
below the last in its place (off by one), every layer a copy of the first (the tensor-parallel
failure class), another row's states. The tiny random model's logit lens is dominated by its
(tied) embeddings, so the layer below its last still predicts its greedy tokens (0.98); the off-by-one
case is therefore shown on the embedded target (slow), where it drops to ~0.5-0.64.
"""

from __future__ import annotations

import json

import pytest
import torch

from draftline import backends
from draftline.artifacts import hidden_states as hsf
from draftline.artifacts.layer_ids import LayerIds
from draftline.fidelity import (
    AUTO_MIN_TOP1_GREEDY,
    AUTO_MIN_TOP1_OTHER,
    FidelityError,
    FidelitySettings,
    Sample,
    check,
    check_recompute,
    measure,
    read_head,
    recompute,
    resolve_min_top1,
    sample_rows,
)
from draftline.stages import hidden_states as hs

QUESTIONS = ["What is the capital of France?", "Write a haiku about rain.", "Explain gravity briefly.",
             "List three fruits.", "How do I boil an egg?", "Name a color."]


class Forward:
    """A target in transformers with its greedy answers to QUESTIONS and their right states."""

    def __init__(self, target, new_tokens: int, rows: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        self.target = target
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(target)
        self.n = self.model.config.num_hidden_layers
        self.extracted = [2, self.n // 2, self.n - 3, self.n]
        self.rows = []  # (token ids, loss mask): prompt 0, the target's greedy answer 1
        for question in QUESTIONS[:rows]:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                   return_dict=True)["input_ids"]
            with torch.no_grad():
                out = self.model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)[0].tolist()
            self.rows.append((out, [0] * len(prompt) + [1] * (len(out) - len(prompt))))
        self.layers = [self._forward(ids) for ids, _ in self.rows]  # per row: every layer, index = vLLM id

    def _forward(self, ids):
        captured = {}
        hook = self.model.model.norm.register_forward_pre_hook(lambda m, a: captured.__setitem__("last", a[0][0]))
        try:
            with torch.no_grad():
                out = self.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        finally:
            hook.remove()
        return [h[0] for h in out[: self.n]] + [captured["last"]]

    def states(self, row: int, ids=None):
        """Row `row`'s stored states for layer ids `ids` (default: the extracted ones)."""
        return torch.stack([self.layers[row][i] for i in (ids or self.extracted)], dim=1)

    def samples(self, corrupt=None):
        corrupt = corrupt or (lambda row: self.states(row))
        return [Sample(r, corrupt(r), ids, mask) for r, (ids, mask) in enumerate(self.rows)]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return Forward(tiny_model, new_tokens=24, rows=4)


def other_row(forward: Forward, row: int):
    """The next row's states cut or repeated to this row's length (token ids stay this row's)."""
    mine, other = forward.states(row), forward.states((row + 1) % len(forward.rows))
    while other.shape[0] < mine.shape[0]:
        other = torch.cat([other, other])
    return other[: mine.shape[0]]


def _check(forward: Forward, corrupt=None, bar: float = AUTO_MIN_TOP1_GREEDY):
    measured = measure(read_head(forward.target), forward.samples(corrupt), forward.extracted)
    check(measured, bar, "shard_0", "auto: greedy regenerated answers")
    return measured


def test_right_states_of_greedy_answers_agree_and_pass(tiny):
    measured = _check(tiny)
    assert measured["top1_assistant"] >= 0.99 and measured["assistant_tokens"] == sum(sum(m) for _, m in tiny.rows)
    assert measured["rows"] == [0, 1, 2, 3] and measured["last_layer"] == 8
    assert [x["layer"] for x in measured["layers"]] == tiny.extracted
    assert all(x["nearest_difference"] > 0.1 for x in measured["layers"])
    json.dumps(measured)  # goes into manifests as it is


def test_all_zero_states_are_caught(tiny):
    with pytest.raises(FidelityError, match=r"shard_0 \(dataset rows 0, 1, 2, 3\): hidden-state fidelity: layer id 2 is all zeros"):
        _check(tiny, lambda r: torch.zeros_like(tiny.states(r)))


def test_every_layer_a_copy_of_the_first_is_caught(tiny):
    with pytest.raises(FidelityError, match=r"layer id 2 equals layer id 4 \(relative difference 0, .*tensor-parallel"):
        _check(tiny, lambda r: tiny.states(r)[:, :1].expand(-1, len(tiny.extracted), -1).clone())


def test_one_state_for_every_token_is_caught(tiny):
    def constant_last(r):
        states = tiny.states(r).clone()
        states[:, -1] = states[-1, -1]  # not the first token (<|im_start|>): its embedding is zero here
        return states

    with pytest.raises(FidelityError, match=r"layer id 8 holds the same state for every token"):
        _check(tiny, constant_last)


def test_states_of_another_row_are_caught(tiny):
    with pytest.raises(FidelityError) as caught:
        _check(tiny, lambda r: other_row(tiny, r))
    message = str(caught.value)
    assert "shard_0 (dataset rows 0, 1, 2, 3)" in message
    assert "stored last layer (layer id 8) predicts the next token on 0.0" in message
    assert f"under hidden_states.fidelity.min_top1 = {AUTO_MIN_TOP1_GREEDY} (auto: greedy regenerated answers)" in message
    assert "lower hidden_states.fidelity.min_top1" in message  # what to do when the answers are not the target's


def test_the_bar_gates_only_the_agreement(tiny):
    """Another row's states pass a bar of 0 (only the layer checks), as a measure-only call does."""
    assert _check(tiny, lambda r: other_row(tiny, r), bar=0.0)["top1_assistant"] < 0.2


@pytest.mark.slow
def test_embedded_target_off_by_one_and_other_failures(embedded_target):
    """On SmolLM2-135M: right states pass; the layer below the last in its place (every id shifted
    down by one), zeros, copies of the first layer and another row's states are caught."""
    smol = Forward(embedded_target, new_tokens=40, rows=4)
    assert _check(smol)["top1_assistant"] >= 0.97
    shifted = [i - 1 for i in smol.extracted]
    with pytest.raises(FidelityError, match=r"layer id 30\) predicts the next token on 0\.[0-7]\d*"):
        _check(smol, lambda r: smol.states(r, shifted))
    with pytest.raises(FidelityError, match=r"layer id 30\) predicts the next token on 0\.[0-7]\d*"):
        _check(smol, lambda r: smol.states(r, smol.extracted[:-1] + [29]))  # only the last one off
    with pytest.raises(FidelityError, match="layer id 2 is all zeros"):
        _check(smol, lambda r: torch.zeros_like(smol.states(r)))
    with pytest.raises(FidelityError, match="layer id 2 equals layer id 15"):
        _check(smol, lambda r: smol.states(r)[:, :1].expand(-1, 4, -1).clone())
    with pytest.raises(FidelityError, match=r"predicts the next token on 0\.0"):
        _check(smol, lambda r: other_row(smol, r))
    # a plain forward tells the off-by-one last layer apart whoever wrote the answers
    # (measured: relative difference 1.00 from layer 30, nearest the forward's layer 29)
    off = recompute(embedded_target, smol.samples(lambda r: smol.states(r, smol.extracted[:-1] + [29]))[:1],
                    smol.extracted)
    assert off["layers"][-1]["nearest_forward_layer"] == 29
    with pytest.raises(FidelityError, match=r"stored layer id 30 differs .* layer 29 \(an off-by-one"):
        check_recompute(off, "shard_0")
    check_recompute(recompute(embedded_target, smol.samples()[:1], smol.extracted), "shard_0")


# ---------------------------------------------------------------- the head


def _small_model(folder, kind: str, tie: bool, shard: str | None = None):
    """A random 2-layer model of `kind` saved to `folder` (sharded when `shard` is a size)."""
    from transformers import AutoModelForCausalLM, GemmaConfig, LlamaConfig

    torch.manual_seed(0)
    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=32, tie_word_embeddings=tie)
    config = GemmaConfig(**shape) if kind == "gemma" else LlamaConfig(**shape)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # a final norm weight that is not all ones, so the (1 + w) form shows
        model.model.norm.weight.copy_(torch.linspace(-0.5, 0.5, 64))
    model.save_pretrained(folder, max_shard_size=shard) if shard else model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("kind, tie, shard", [("llama", False, "40KB"), ("llama", True, None), ("gemma", True, None)])
def test_head_logits_are_the_models_own(tmp_path, kind, tie, shard):
    """read_head's norm + lm_head on the last layer give the model's own logits: untied from a
    sharded checkpoint (reading only the shards holding the two tensors), tied, and Gemma's (1 + w)."""
    model = _small_model(tmp_path, kind, tie, shard)
    if shard:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
        assert len(set(index.values())) > 2  # more shards than the two tensors need
    head = read_head(tmp_path)
    assert (head.tied, head.norm_kind) == (tie, "rms_one_plus" if kind == "gemma" else "rms")
    ids = torch.tensor([[5, 17, 33, 2, 250]])
    captured = {}
    model.model.norm.register_forward_pre_hook(lambda m, a: captured.__setitem__("last", a[0][0]))
    with torch.no_grad():
        logits = model(ids).logits[0]
    torch.testing.assert_close(head.logits(captured["last"]).cpu(), logits, rtol=1e-4, atol=1e-4)


def test_an_unknown_norm_is_refused_naming_the_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64}))
    with pytest.raises(FidelityError, match=r"not model_type 'gpt2'; .*hidden_states.fidelity.rows: 0"):
        read_head(tmp_path)


# ---------------------------------------------------------------- settings


def test_auto_bar_follows_where_the_answers_come_from():
    assert resolve_min_top1("auto", True, 0.0) == (AUTO_MIN_TOP1_GREEDY, "auto: greedy regenerated answers")
    assert resolve_min_top1("auto", False, 0.0)[0] == AUTO_MIN_TOP1_OTHER
    assert resolve_min_top1("auto", True, 0.7) == (AUTO_MIN_TOP1_OTHER, "auto: answers sampled at regenerate.temperature 0.7")
    assert resolve_min_top1(0.5, True, 0.0) == (0.5, "set in hidden_states.fidelity.min_top1")
    assert AUTO_MIN_TOP1_OTHER < AUTO_MIN_TOP1_GREEDY


def test_sample_rows_spread_over_the_shard():
    assert sample_rows(range(100, 200), 4) == [112, 137, 162, 187]
    assert sample_rows(range(3), 8) == [0, 1, 2]
    assert sample_rows(range(10, 20), 1) == [15]


# ---------------------------------------------------------------- in the extraction


class CorruptBackend:
    """The transformers backend's states with `corrupt(row, states)` applied before each file is
    written (as a buggy engine or connector would hand them over): valid files, wrong states."""

    name = "transformers"

    def __init__(self, forward: Forward, corrupt):
        self.forward, self.corrupt, self.calls = forward, corrupt, 0

    def extract(self, request):
        from safetensors.torch import save_file

        self.calls += 1
        for r in request.rows:
            states = self.corrupt(r, self.forward.states(r))
            save_file({"hidden_states": states.contiguous(), "token_ids": torch.tensor(request.token_ids[r])},
                      str(request.dest / hsf.file_name(r)))
        return backends.Extracted(sum(len(request.token_ids[r]) for r in request.rows), 0.0, 0.1)


@pytest.fixture
def greedy_dataset(tiny, tmp_path):
    from datasets import Dataset

    ids = [i for i, _ in tiny.rows]
    masks = [m for _, m in tiny.rows]
    Dataset.from_dict({"input_ids": ids, "loss_mask": masks, "seq_len": list(map(len, ids))}).save_to_disk(
        str(tmp_path / "dataset"))
    return tmp_path / "dataset"


def test_an_extraction_with_wrong_states_publishes_nothing_and_keeps_its_staged_files(
    tiny, greedy_dataset, tmp_path, monkeypatch
):
    """Shard 1 of 2 (rows 2, 3) with another row's states: the check stops it before publishing,
    naming the shard, the layer, the agreement and the bar; the staged files stay, so a rerun with
    another bar publishes them without extracting again (the manifest records the figures)."""
    broken = CorruptBackend(tiny, lambda r, states: other_row(tiny, r))
    monkeypatch.setattr(backends, "get", lambda name: broken)
    layers = LayerIds(aux=tiny.extracted[:-1], num_hidden_layers=tiny.n)
    out = tmp_path / "hidden_states" / "shard_1"
    greedy = FidelitySettings(rows=8, min_top1=AUTO_MIN_TOP1_GREEDY, basis="auto: greedy regenerated answers")
    with pytest.raises(FidelityError) as caught:
        hs.extract_shard(greedy_dataset, tiny.target, layers, hs.ShardJob(1, 2, out),
                         extraction=hs.ExtractionSettings(backend="transformers", fidelity=greedy))
    message = str(caught.value)
    assert f"hidden-state shard 1 of 2 ({out}) (dataset rows 2, 3)" in message
    assert "stored last layer (layer id 8) predicts the next token on 0.0" in message
    assert f"min_top1 = {AUTO_MIN_TOP1_GREEDY}" in message and "Nothing was published" in message
    assert not out.exists()
    staged = list((tmp_path / "hidden_states" / ".staging").glob("shard_1-*/hs_*.safetensors"))
    assert sorted(p.name for p in staged) == ["hs_2.safetensors", "hs_3.safetensors"]

    manifest = hs.extract_shard(greedy_dataset, tiny.target, layers, hs.ShardJob(1, 2, out),
                                extraction=hs.ExtractionSettings(
                                    backend="transformers",
                                    fidelity=FidelitySettings(rows=8, min_top1=0.0, basis="test", recompute_rows=0)))
    assert broken.calls == 1 and manifest["reused_rows"] == 2  # the staged files, not a new extraction
    assert manifest["fidelity"]["top1_assistant"] < 0.2 and manifest["fidelity"]["min_top1"] == 0.0
    assert hsf.read_manifest(out)["fidelity"]["rows"] == [2, 3]


def test_an_extraction_with_right_states_records_its_fidelity_in_the_manifest_and_view(
    tiny, greedy_dataset, tmp_path, monkeypatch
):
    monkeypatch.setattr(backends, "get", lambda name: CorruptBackend(tiny, lambda r, states: states))
    layers = LayerIds(aux=tiny.extracted[:-1], num_hidden_layers=tiny.n)
    greedy = FidelitySettings(rows=1, min_top1=AUTO_MIN_TOP1_GREEDY, basis="auto: greedy regenerated answers")
    shards = [tmp_path / "hidden_states" / f"shard_{k}" for k in range(2)]
    for k, out in enumerate(shards):
        manifest = hs.extract_shard(greedy_dataset, tiny.target, layers, hs.ShardJob(k, 2, out),
                                    extraction=hs.ExtractionSettings(backend="transformers", fidelity=greedy))
        assert manifest["fidelity"]["rows"] == [2 * k + 1]  # one row: the middle of the shard's two
        assert manifest["fidelity"]["top1_assistant"] >= 0.99
    view = hs.build_training_view(shards, tmp_path / "hidden_states" / "all")
    total = view["fidelity"]["total"]
    assert total["rows"] == 2 and total["top1_assistant"] >= 0.99 and total["min_top1"] == AUTO_MIN_TOP1_GREEDY
    assert set(view["fidelity"]["shards"]) == {str(s) for s in shards}


# ---------------------------------------------------------------- online


@pytest.mark.dag
def test_online_states_are_checked_before_the_trainer_starts(tiny, greedy_dataset, tmp_path):
    """hidden_states.mode online: the train job's server (vLLM CPU) makes the sampled rows' states
    as the Trainer would ask for them; right states of greedy answers pass and are recorded, and
    answers that are not the target's (random tokens) stop the job before training, naming the
    server, the layer, the agreement and the bar."""
    import random

    from datasets import Dataset

    from draftline.backends.vllm_server import ServerSettings, VllmServer
    from draftline.runtime.vllm_engine import EngineSettings
    from draftline.stages.train import HiddenStateSource, TrainInputs, check_online_fidelity

    rng = random.Random(0)
    noise = [[rng.randrange(1, 500) for _ in range(len(ids))] for ids, _ in tiny.rows]
    Dataset.from_dict({"input_ids": noise, "loss_mask": [m for _, m in tiny.rows],
                       "seq_len": list(map(len, noise))}).save_to_disk(str(tmp_path / "noise"))
    settings = ServerSettings(target_dir=str(tiny.target), extracted=tuple(tiny.extracted), cuda=False,
                              engine=EngineSettings(max_model_len=256, dtype="float32", enforce_eager=True, threads=1))
    greedy = FidelitySettings(rows=3, min_top1=AUTO_MIN_TOP1_GREEDY, basis="auto: greedy regenerated answers")
    source = HiddenStateSource(mode="online", server_log=str(tmp_path / "server.log"), fidelity=greedy)

    def inputs(dataset):
        return TrainInputs(config_dir=tmp_path, dataset=dataset, hidden_states=None, d2t=tmp_path, t2d=tmp_path,
                           layer_ids=tmp_path, target=str(tiny.target))

    with VllmServer(settings, tmp_path / "scratch", source.server_log) as server:
        record = check_online_fidelity(inputs(greedy_dataset), server.endpoint, source, settings)
        assert record["rows"] == [0, 2, 3] and record["top1_assistant"] >= 0.99
        assert record["min_top1"] == AUTO_MIN_TOP1_GREEDY and [x["layer"] for x in record["layers"]] == tiny.extracted
        with pytest.raises(FidelityError, match=r"the online hidden-state server for .* \(dataset rows 0, 2, 3\): .*"
                                                r"layer id 8\) predicts the next token on 0\.0\d* .*fidelity\.min_top1 = 0\.8"):
            check_online_fidelity(inputs(tmp_path / "noise"), server.endpoint, source, settings)
    assert not list((tmp_path / "scratch").glob("*.safetensors"))  # every file read and deleted


def test_the_views_total_counts_every_shard_naming_the_unchecked_ones_and_each_bar():
    from draftline.fidelity import combine

    def record(rows, tokens, top1, bar, basis):
        return {"rows": rows, "assistant_tokens": tokens, "top1_assistant": top1, "min_top1": bar, "basis": basis}

    greedy = "auto: greedy regenerated answers"
    total = combine({"s0": record([1, 2], 100, 0.99, 0.8, greedy), "s1": None,
                     "s2": record([7], 300, 0.95, 0.5, "set in hidden_states.fidelity.min_top1")})
    assert total["shards"] == 3 and total["checked_shards"] == 2 and total["unchecked_shards"] == ["s1"]
    assert total["bars"] == {"s0": 0.8, "s2": 0.5} and total["min_top1"] == 0.8
    assert total["basis"] == "differs by shard (see bars)"
    assert total["top1_assistant"] == round((99 + 285) / 400, 4) and total["lowest_shard_top1_assistant"] == 0.95
    assert total["rows"] == 3
    same = combine({"s0": record([1], 10, 0.9, 0.8, greedy), "s1": record([2], 10, 1.0, 0.8, greedy)})
    assert same["min_top1"] == 0.8 and same["basis"] == greedy and same["unchecked_shards"] == []
    assert combine({"s0": None, "s1": None}) is None  # nothing checked: no figure at all


def test_an_off_by_one_last_layer_passes_the_answers_bar_but_not_a_plain_forward_of_a_few_rows(
    tiny, greedy_dataset, tmp_path, monkeypatch
):
    """The layer below the last stored as the last one: the head's agreement cannot tell (the tiny
    model's layer below predicts its tokens too; with the dataset's own answers the bar is 0.2), a
    plain transformers forward of two rows can, naming the layer it matches."""
    monkeypatch.setattr(backends, "get", lambda name: CorruptBackend(
        tiny, lambda r, states: tiny.states(r, tiny.extracted[:-1] + [tiny.n - 1])))
    layers = LayerIds(aux=tiny.extracted[:-1], num_hidden_layers=tiny.n)
    theirs = dict(rows=8, min_top1=AUTO_MIN_TOP1_OTHER, basis="auto: the dataset's own answers")

    def extract(out, **fidelity):
        return hs.extract_shard(greedy_dataset, tiny.target, layers, hs.ShardJob(0, 1, out),
                                extraction=hs.ExtractionSettings(backend="transformers",
                                                                 fidelity=FidelitySettings(**theirs, **fidelity)))

    assert extract(tmp_path / "agreement_only", recompute_rows=0)["fidelity"]["top1_assistant"] > 0.9
    with pytest.raises(FidelityError, match=rf"stored layer id {tiny.n} differs from a plain transformers forward "
                                            rf".* nearest to the forward's layer {tiny.n - 1} \(an off-by-one"):
        extract(tmp_path / "recomputed")
    assert not (tmp_path / "recomputed").exists()


def test_right_states_pass_the_recompute_and_it_is_recorded(tiny, greedy_dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "get", lambda name: CorruptBackend(tiny, lambda r, states: states))
    layers = LayerIds(aux=tiny.extracted[:-1], num_hidden_layers=tiny.n)
    manifest = hs.extract_shard(greedy_dataset, tiny.target, layers, hs.ShardJob(0, 1, tmp_path / "shard_0"),
                                extraction=hs.ExtractionSettings(backend="transformers", fidelity=FidelitySettings()))
    recomputed = manifest["fidelity"]["recomputed"]
    assert len(recomputed["rows"]) == 2
    assert [x["nearest_forward_layer"] for x in recomputed["layers"]] == tiny.extracted
    assert max(x["relative_difference"] for x in recomputed["layers"]) < 1e-5
