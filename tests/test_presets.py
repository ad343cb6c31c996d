"""The recipes for real targets (config/presets/dense_8b.yaml, moe_235b.yaml) with their Slurm
profiles: each validates against the schema and plans, with a tiny local model standing in for
the target (8 attention heads, so tensor_parallel_size 8 fits it; 4096 positions, so the
recipes' lengths are kept). Only the target and the draft vocabulary (the tiny model has 512
tokens) are changed; the dry run prints the sizing estimate before any job."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from workflow import REPO, snakemake, write_config

RECIPES = {
    # preset -> its Slurm profile, the GPUs each vLLM job and the training job ask for
    "dense_8b": ("slurm_dense_8b", 1, 1),
    "moe_235b": ("slurm_moe_235b", 8, 8),
}


@pytest.fixture(scope="module")
def tiny_model_8_heads(tmp_path_factory):
    from draftline.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-8-heads"), num_layers=8, hidden_size=512,
                            max_position_embeddings=4096)  # fmt: skip


def _resources(dry_run: str) -> dict[str, dict[str, str]]:
    """Rule -> its first job's resources, as the dry run prints them."""
    found: dict[str, dict[str, str]] = {}
    for block in dry_run.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0].strip()
        match = re.search(r"^\s+resources: (.*)$", block, re.M)
        if match and rule not in found:
            found[rule] = dict(item.split("=", 1) for item in match.group(1).split(", "))
    return found


@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_recipe_plans_with_its_profile(preset, tiny_model_8_heads, tmp_path):
    profile, vllm_gpus, train_gpus = RECIPES[preset]
    config = yaml.safe_load((REPO / "config/presets" / f"{preset}.yaml").read_text())
    (tmp_path / "resources/prompts").mkdir(parents=True)
    shutil.copy(REPO / "resources/prompts/default.jsonl", tmp_path / "resources/prompts/default.jsonl")
    assert config["prompts"]["sources"] == ["resources/prompts/default.jsonl"]
    config["target"]["model"] = str(tiny_model_8_heads)
    config["vocab"]["draft_vocab_size"] = 256
    write_config(tmp_path, config)

    out = snakemake(tmp_path, "-n", "--workflow-profile", str(REPO / "profiles" / profile))
    text = out.stdout + out.stderr
    # the cost of the config, printed before any job: 865 prompts less the held-out ones
    held_out = config["prompts"]["validation"] + config["prompts"]["test"]
    sizing = re.search(r"draftline: sizing for .* on cuda: ([\d,]+) training conversations x <= ([\d,]+) tokens", text)
    assert sizing, text[-3000:]
    assert int(sizing.group(1).replace(",", "")) == 865 - held_out
    assert int(sizing.group(2).replace(",", "")) == config["tokenize"]["max_seq_len"]
    assert "GPU time per stage: regeneration" in text and "hidden states <=" in text

    resources = _resources(out.stdout)
    for rule in ("regenerate_shard", "hidden_states_shard", "evaluate"):
        assert resources[rule]["gpu"] == str(vllm_gpus), rule
    assert resources["train"]["gpu"] == str(train_gpus)
    assert all("runtime" in resources[r] and "mem_mb" in resources[r] for r in ("regenerate_shard", "train"))
    jobs = re.findall(r"^rule (\w+):", out.stdout, re.M)
    assert jobs.count("regenerate_shard") == config["regenerate"]["shards"]
    assert jobs.count("hidden_states_shard") == config["hidden_states"]["shards"]
    assert "summary" in jobs  # results/summary.md is part of the default target

    # `preflight` runs its engines on the nodes the vLLM jobs get: the same GPUs and memory
    preflight = _resources(snakemake(tmp_path, "-n", "--workflow-profile", str(REPO / "profiles" / profile),
                                     "preflight").stdout)  # fmt: skip
    for rule in ("preflight_environment", "preflight_regenerate", "preflight_hidden_states", "preflight_speculative"):
        assert preflight[rule]["gpu"] == str(vllm_gpus), rule
        assert preflight[rule]["mem_mb"] == resources["regenerate_shard"]["mem_mb"], rule
        assert preflight[rule]["cpus_per_gpu"] == resources["regenerate_shard"]["cpus_per_gpu"], rule


def test_sizing_table_matches_the_measured_8b_rates():
    """The estimate reproduces the H200 measurements it is built on for the 8B shape (extraction
    29.5k tokens/s at 0.54 of the limit, training 28.1k tokens/s) and the file size per token."""
    from draftline import sizing

    plan = sizing.Plan(conversations=96, max_seq_len=2052, max_new_tokens=0, epochs=1, eval_prompts=0,
                       eval_new_tokens=0, regenerate=False)  # fmt: skip
    est = sizing.estimate(sizing.LLAMA_8B, plan)
    assert est["rates_tokens_per_s"]["extraction"] == pytest.approx(29_500, rel=0.02)
    assert est["rates_tokens_per_s"]["training"] == pytest.approx(28_138)
    assert est["bytes_per_token"] == 32_776  # measured: 4 layers x 4096 x 2 B + the token id
    assert sizing.LLAMA_8B.active_linear == 6_979_321_856  # docs/gpu.md's P_lin
    assert est["device_hours"]["regeneration"] == 0


def test_the_plan_sizes_a_config_from_its_sources_or_says_what_it_waits_for(tmp_path, monkeypatch):
    """Before the first job: the count of the sources' rows less the held-out prompts (capped at
    prompts.max_samples), the prompts job's count once it ran, or a line naming what is missing."""
    import json

    from snakemake.utils import validate

    from draftline import sizing, sources

    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"prompt": f"question {i}"} for i in range(500)]))
    config = {"prompts": {"sources": [str(rows)], "validation": 20, "test": 30}}
    validate(config, str(REPO / "config/schema/config.schema.yaml"), set_default=True)

    def line(target_kind="embedded", target_dir=tmp_path, device="cpu", summary=None):
        planned = sizing.planned_training_rows(config, summary)
        return sizing.for_config(config, target_kind, target_dir, device, 1, planned)

    assert re.search(r"sizing for SmolLM2-135M on cpu: 450 training conversations x", line()), line()

    config["prompts"]["max_samples"] = 100
    assert " 100 training conversations x" in line()
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"train": 77}))
    assert " 77 training conversations x" in line(summary=summary)

    config["prompts"]["max_samples"] = None
    monkeypatch.setattr(sources, "COUNT_JSON_LIST_MAX_BYTES", 100)
    text = line()
    assert text.startswith(f"no sizing estimate before the first job: {rows}: a JSON list of ") and \
        text.endswith("set prompts.max_samples to size the run before the prompts job"), text
    text = line("hub", tmp_path / "not-downloaded", "cuda")
    assert text.startswith("no sizing estimate before the first job: the target's config.json is not in "), text
