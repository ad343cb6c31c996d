"""docs/sizing.md's tables: per 100 M tokens on each group of GPU kinds alike (`table`, gpu_groups), and
the recipes (a preset, its target's shape and its Slurm profile) as their own dry runs size them
(`recipes_table`); `docs_tables` is the page's block of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftline.planning.sizing.estimate import GPUS, Plan, estimate, gpu_groups
from draftline.planning.sizing.inputs import config_estimate, gpu_overrides, planned_train_gpus, planned_training_rows
from draftline.planning.sizing.line import _bytes
from draftline.planning.sizing.shapes import LLAMA_8B, LLAMA_70B, QWEN3_235B, Shape
from draftline.settings import TargetBlock


def table(gpu: str = "H200", tokens: int = 100_000_000, seq_len: int = 2048, new_tokens_share: float = 0.5) -> str:
    """The docs' table: per 100 M tokens (conversations of seq_len, half of them generated, one
    user turn each), on `gpu` (a GPUS kind)."""
    conversations = tokens // seq_len
    rows = [
        "| target | GPUs per vLLM job | regeneration | extraction | training (per epoch) | evaluation | hidden states |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, gpus in ((LLAMA_8B, 1), (LLAMA_70B, 4), (QWEN3_235B, 8)):
        plan = Plan(conversations, seq_len, int(seq_len * new_tokens_share), 1, 100, 128, gpus_per_vllm_job=gpus,
                    eval_headline_prompts=50)
        est = estimate(shape, plan, gpu=gpu)
        h, r = est["device_hours"], est["rates_tokens_per_s"]
        rows.append(
            f"| {shape.name} | {gpus} | {h['regeneration']:.1f} ({r['regeneration']:,.0f} tok/s/GPU) | "
            f"{h['extraction']:.1f} ({r['extraction']:,.0f} tok/s/GPU) | {h['training']:.1f} "
            f"({r['training']:,.0f} tok/s/GPU) | {h['evaluation']:.2f} | {_bytes(est['hidden_state_bytes'])} "
            f"({est['bytes_per_token']:,} B/token) |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class Recipe:
    """A preset for a real target, the target's shape, and the Slurm profile it runs with."""

    shape: Shape
    profile: str


RECIPES = {"config/presets/dense_8b.yaml": Recipe(LLAMA_8B, "profiles/slurm_dense_8b"),
           "config/presets/moe_235b.yaml": Recipe(QWEN3_235B, "profiles/slurm_moe_235b")}


def recipe_config(repo: Path, preset: str) -> dict:
    """config/config.yaml with the preset over it and the schema's defaults, as a run reads them."""
    import yaml
    from snakemake.utils import update_config, validate

    config = yaml.safe_load((repo / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((repo / preset).read_text()))
    validate(config, str(repo / "config/schema/config.schema.yaml"), set_default=True)
    return config


def recipe_train_gpus(repo: Path, preset: str) -> int:
    """The GPUs the recipe's train job asks for with its profile (its set-resources' `gpu`), as the
    plan counts them (planned_train_gpus)."""
    import yaml

    profile = yaml.safe_load((repo / RECIPES[preset].profile / "config.yaml").read_text())
    train = (profile.get("set-resources") or {}).get("train") or {}
    return planned_train_gpus(recipe_config(repo, preset), gpu_overrides({"train": train.get("gpu")}))[1]


def recipe_estimates(repo: Path, preset: str) -> dict[str, dict]:
    """The recipe's estimates as its dry run with its profile computes them (config_estimate):
    {each GPUS kind: for prompts.max_samples conversations, "shipped": for the shipped prompts (H200)}."""
    import os

    config, shape, train_gpus = recipe_config(repo, preset), RECIPES[preset].shape, recipe_train_gpus(repo, preset)
    cwd = os.getcwd()
    try:
        os.chdir(repo)  # the preset's relative paths: its sources, the evaluated sets
        shipped, _ = planned_training_rows(config)
        sized = {gpu: config_estimate(shape, config, config["prompts"]["max_samples"], train_gpus, gpu=gpu)
                 for gpu in GPUS}
        return {**sized, "shipped": config_estimate(shape, config, shipped, train_gpus)}
    finally:
        os.chdir(cwd)


def recipes_table(repo: Path) -> str:
    """The recipes' cost for the data they are sized for (prompts.max_samples single-turn conversations
    at tokenize.max_seq_len), one GPU-hours column per group of GPU kinds alike (gpu_groups), and for the
    shipped prompts as they stand, each with its profile's training GPUs: what the dry run prints
    (tests/test_presets.py checks it). Training and the shipped prompts' column: on H200s and the kinds alike."""
    groups = gpu_groups()
    h200s = " or ".join(next(g.kinds for g in groups if "H200" in g.kinds))
    hours = " | ".join(f"GPU-hours ({' or '.join(g.kinds)})" for g in groups)
    rows = [
        f"| preset | target | GPUs per vLLM job | data | {hours} | training ({h200s}) | "
        f"hidden states | with the shipped prompts ({h200s}) |",
        "|---|---|---|---|" + "---|" * len(groups) + "---|---|---|",
    ]
    for preset, recipe in RECIPES.items():
        config, est = recipe_config(repo, preset), recipe_estimates(repo, preset)
        h200, train_gpus = est["H200"], recipe_train_gpus(repo, preset)
        gpus = TargetBlock.model_validate(config["target"]).vllm_ranks
        data = (f"{est['H200']['conversations']:,} conversations, {config['tokenize']['max_seq_len']:,} tokens, "
                f"answers <= {config['regenerate']['max_new_tokens']:,}, {config['train']['epochs']} epochs")
        # the GPU-hours its GPUs wait on the hidden states' reads (sizing.filesystem_gb_per_s)
        reading = h200["io_hours"].get("training", 0.0) * train_gpus
        training = (f"{train_gpus} GPU{'s' if train_gpus > 1 else ''} (its profile's): "
                    f"{h200['device_hours']['training']:.1f} GPU-hours, {reading:.1f} of them reading the hidden states")
        totals = " | ".join(f"{sum(est[g.kinds[0]]['device_hours'].values()):.1f}" for g in groups)
        rows.append(
            f"| `{preset}` | {recipe.shape.name} | {gpus} | {data} | {totals} | {training} | "
            f"<= {_bytes(h200['hidden_state_bytes'])} | "
            f"{est['shipped']['conversations']:,} conversations: {sum(est['shipped']['device_hours'].values()):.1f} "
            "GPU-hours |"
        )
    return "\n".join(rows)


def docs_tables(repo: Path) -> str:
    """What docs/sizing.md shows between its `sizing tables` marks (tests/test_docs.py checks it): one
    table per group of GPU kinds alike (gpu_groups), then the recipes'."""
    return "\n\n".join([*(f"On {g.label} ({g.basis}):\n\n{table(g.kinds[0])}" for g in gpu_groups()),
                        f"Recipes:\n\n{recipes_table(repo)}"])
