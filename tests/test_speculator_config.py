"""The eagle3 speculator config: built like `speculators train` builds it, loadable by it."""

from __future__ import annotations

import json

import pytest

AUX = [2, 4, 5]


@pytest.fixture()
def layer_ids(tmp_path):
    path = tmp_path / "layer_ids.json"
    path.write_text(json.dumps({"aux": AUX, "extracted": [*AUX, 8], "num_hidden_layers": 8}))
    return path


def test_config_folder_loads_back_with_the_configured_fields(tiny_model, layer_ids, tmp_path):
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.utils.loading import is_config_only_dir

    from draftline.algorithms import DraftSettings
    from draftline.stages.speculator_config import write_speculator_config

    out = write_speculator_config(tmp_path / "config", tiny_model, layer_ids, 64, DraftSettings(num_layers=2, ttt_steps=4))
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert is_config_only_dir(out)  # `speculators train --from-pretrained` initialises fresh weights
    config = Eagle3SpeculatorConfig.from_pretrained(out)
    target = json.loads((tiny_model / "config.json").read_text())
    layer = config.transformer_layer_config
    assert config.draft_vocab_size == 64
    assert config.eagle_aux_hidden_state_layer_ids == AUX
    assert layer.num_hidden_layers == 2
    assert layer.hidden_size == target["hidden_size"] and layer.vocab_size == target["vocab_size"]
    assert config.speculators_config.verifier.name_or_path == str(tiny_model)
    assert config.speculators_config.verifier.architectures == ["LlamaForCausalLM"]
    assert config.speculators_config.proposal_methods[0].speculative_tokens == 4


def test_config_matches_what_speculators_train_builds(tiny_model):
    """Same fields as `Eagle3DraftModel.from_training_args` (the `speculators train` path)."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config

    from draftline.algorithms import DraftSettings
    from draftline.algorithms.eagle3 import resolve_train_args
    from draftline.stages.speculator_config import build_speculator_config

    settings = DraftSettings(num_layers=1, ttt_steps=3)
    ours = build_speculator_config(tiny_model, AUX, 64, settings)
    args = resolve_train_args(str(tiny_model), AUX, 64, settings, "eagle3", False)
    layer = create_transformer_layer_config(
        str(tiny_model), 1, args["draft_arch"], args["draft_hidden_act"], args["sliding_window"],
        args["full_attention_indices"],
    )
    t2d = torch.zeros(512, dtype=torch.bool)
    t2d[:64] = True
    model = Eagle3DraftModel.from_training_args(layer, t2d=t2d, d2t=torch.zeros(64, dtype=torch.long), **args)
    theirs = model.config.to_dict()
    theirs.pop("tie_word_embeddings")  # set on the config by the model's constructor
    assert ours.to_dict() == theirs


def test_draft_vocab_larger_than_target_is_a_clear_error(tiny_model, layer_ids, tmp_path):
    from draftline.stages.speculator_config import write_speculator_config

    with pytest.raises(ValueError, match="vocab.draft_vocab_size = 1000"):
        write_speculator_config(tmp_path / "config", tiny_model, layer_ids, 1000)
    assert not (tmp_path / "config").exists()
