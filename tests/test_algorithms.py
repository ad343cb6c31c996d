"""The draft-algorithm seam: a second algorithm (DFlash) through the same DAG as EAGLE-3, on a copy
of the finished tiny-model run (real speculators Trainer, real vLLM CPU speculative decoding)."""

from __future__ import annotations

import json

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
