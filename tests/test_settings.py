"""The typed settings (draftline.settings) as the one source of the config's defaults: the
schema Snakemake validates against is their export, its defaults are theirs once Snakemake has
filled them in, and the models read a validated config as it is."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from draftline.settings import DEFAULTS, DraftlineConfig, default, output_changing
from draftline.settings.schema import SCHEMA, export, schema_text

REPO = Path(__file__).resolve().parents[1]


def test_the_committed_schema_is_the_models_export():
    assert SCHEMA.read_text() == schema_text(), "run: PYTHONPATH=src python -m draftline.settings.export"
    assert yaml.safe_load(SCHEMA.read_text()) == export()


def test_the_schema_has_no_references():
    """Snakemake fills a default only where it meets it under `properties`: nothing behind a $ref."""
    assert "$ref" not in SCHEMA.read_text() and "$defs" not in SCHEMA.read_text()


def test_snakemake_fills_every_default_of_an_empty_config():
    config: dict = {}
    validate(config, str(SCHEMA))
    assert config == DEFAULTS.model_dump()
    assert config["hidden_states"]["fidelity"] == {"rows": 8, "min_top1": "auto", "recompute_rows": 2}


def test_snakemake_fills_the_keys_a_partial_config_leaves_out():
    config = {"train": {"epochs": 5}, "hidden_states": {"fidelity": {"rows": 0}}, "evaluate": {"prompt_sets": {"code": "c.jsonl"}}}
    validate(config, str(SCHEMA))
    expected = DEFAULTS.model_dump()
    expected["train"]["epochs"] = 5
    expected["hidden_states"]["fidelity"]["rows"] = 0
    expected["evaluate"]["prompt_sets"] = {"code": "c.jsonl"}
    assert config == expected


def test_the_models_read_the_configs_snakemake_validates_as_they_are():
    """config/config.yaml, filled by Snakemake, read by the models and dumped again: the same
    values, of the same types (an int given for a number stays an int: a param's repr decides
    staleness)."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate(config, str(SCHEMA))
    typed = DraftlineConfig.model_validate(copy.deepcopy(config))
    assert typed.model_dump() == config
    assert type(typed.train.checkpoint_freq) is type(config["train"]["checkpoint_freq"])
    assert type(DEFAULTS.hidden_states.online_server_timeout_s) is int


@pytest.mark.parametrize("block, bad", [
    ({"train": {"epochz": 3}}, "epochz"),
    ({"train": {"epochs": 0}}, "epochs"),
    ({"hidden_states": {"layer_ids": [2, 2]}}, "layer_ids"),
    ({"hidden_states": {"format": "int4"}}, "format"),
    ({"vllm": {"gpu_memory_utilization": 1.5}}, "gpu_memory_utilization"),
    ({"evaluate": {"prompt_sets": {"test": "t.jsonl"}}}, "prompt_sets"),
])
def test_the_models_refuse_what_the_schema_refuses(block, bad):
    from pydantic import ValidationError
    from snakemake.exceptions import WorkflowError

    with pytest.raises(WorkflowError, match="Error validating config file"):
        validate(copy.deepcopy(block), str(SCHEMA))
    with pytest.raises(ValidationError, match=bad):
        DraftlineConfig.model_validate(block)


def test_defaults_and_marks_are_read_from_the_models():
    assert default("train", "epochs") == DEFAULTS.train.epochs == 3
    assert default("hidden_states", "fidelity") == DEFAULTS.hidden_states.fidelity.model_dump()
    assert default("prompts", "sources") is not DEFAULTS.prompts.sources  # a copy: the caller may change it
    with pytest.raises(KeyError, match="no default for train.no_such_key"):
        default("train", "no_such_key")
    with pytest.raises(KeyError, match="no config block 'trian'"):
        default("trian", "epochs")
    assert output_changing("vllm") == ("max_model_len", "quantization", "kv_cache_dtype", "engine_args")
    with pytest.raises(KeyError, match="carries no changes_outputs"):
        output_changing("train")


def test_the_models_are_frozen():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        DEFAULTS.train.epochs = 4


def test_dotted_command_line_keys_are_the_models():
    """`--config train.lr=3e-4` is rewritten into the block Snakemake takes when the models have
    the key (open mappings take any key below them); a key they lack stops naming it."""
    from draftline.settings.command_line import CommandLineError, rewrite_config_args

    words = ["snakemake", "--config", "train.lr=3e-4", "vllm.engine_args.block_size=32", "hidden_states.fidelity.rows=0"]
    assert rewrite_config_args(words) == ["snakemake", "--config", 'train={"lr": "3e-4"}', 'vllm={"engine_args": {"block_size": "32"}}',
                                          'hidden_states={"fidelity": {"rows": "0"}}']
    with pytest.raises(CommandLineError, match=r"--config train\.epochz: train has no key 'epochz' \(its keys: epochs, lr"):
        rewrite_config_args(["snakemake", "--config", "train.epochz=3"])
    with pytest.raises(CommandLineError, match=r"the config's top level has no key 'trian'"):
        rewrite_config_args(["snakemake", "--config", "trian.epochs=3"])
    with pytest.raises(CommandLineError, match=r"train\.epochs is a setting, with no keys below it"):
        rewrite_config_args(["snakemake", "--config", "train.epochs.x=1"])
