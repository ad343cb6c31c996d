"""The recipes for real targets (config/presets/dense_8b.yaml, moe_235b.yaml) with their Slurm
profiles: each validates against the schema and plans, with a tiny local model standing in for
the target (8 attention heads, so tensor_parallel_size 8 fits it; 4096 positions, so the
recipes' lengths are kept). Only the target and the draft vocabulary (the tiny model has 512
tokens) are changed; the dry run prints the sizing estimate before any job."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml
from workflow import REPO, SNAKEMAKE, copy_workflow, snakemake, write_config

RECIPES = {
    # preset -> its Slurm profile, the GPUs each vLLM job and the training job ask for
    "dense_8b": ("slurm_dense_8b", 1, 1),
    "moe_235b": ("slurm_moe_235b", 8, 1),
}


@pytest.fixture(scope="module")
def tiny_model_8_heads(tmp_path_factory):
    from draftline.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-8-heads"), num_layers=8, hidden_size=512,
                            max_position_embeddings=4096)


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
    # the H200s' figures are the H100s' (GPUS: equal rates), printed once for both (gpu_groups)
    assert "draftline:   GPU time per stage on H200s and H100s " in text and "hidden states <=" in text
    assert "on H100s: total " not in text

    resources = _resources(out.stdout)
    for rule in ("regenerate_shard", "hidden_states_shard", "evaluate_set", "evaluate_baseline"):
        assert resources[rule]["gpu"] == str(vllm_gpus), rule
    assert resources["train"]["gpu"] == str(train_gpus)
    assert all("runtime" in resources[r] and "mem_mb" in resources[r] for r in ("regenerate_shard", "train"))
    jobs = re.findall(r"^rule (\w+):", out.stdout, re.M)
    assert jobs.count("regenerate_shard") == config["regenerate"]["shards"]
    assert jobs.count("hidden_states_shard") == config["hidden_states"]["shards"]
    assert "summary" in jobs  # results/summary.md is part of the default target

    # `preflight` runs its engines on the nodes the vLLM jobs get: the same GPUs and memory
    preflight = _resources(snakemake(tmp_path, "-n", "--workflow-profile", str(REPO / "profiles" / profile),
                                     "preflight").stdout)
    for rule in ("preflight_environment", "preflight_regenerate", "preflight_hidden_states", "preflight_speculative"):
        assert preflight[rule]["gpu"] == str(vllm_gpus), rule
        assert preflight[rule]["mem_mb"] == resources["regenerate_shard"]["mem_mb"], rule
        assert preflight[rule]["cpus_per_gpu"] == resources["regenerate_shard"]["cpus_per_gpu"], rule
    # ... and its training step on the train job's: the same GPUs, memory and cores
    for key in ("gpu", "mem_mb", "cpus_per_gpu"):
        assert preflight["preflight_training"][key] == resources["train"][key], key


def _target_folder(folder, tokenizer_from, shape) -> str:
    """A target folder whose config.json has `shape` (a sizing.Shape: the real target's published
    values), the tokenizer and weights of a tiny model beside it: the plan reads only the config."""
    shutil.copytree(tokenizer_from, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(num_hidden_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
                  num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, intermediate_size=shape.intermediate,
                  vocab_size=shape.vocab, max_position_embeddings=40960)
    if shape.experts:
        config.update(num_experts=shape.experts, num_experts_per_tok=shape.experts_per_token,
                      moe_intermediate_size=shape.expert_intermediate)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_the_recipes_table_is_what_the_dry_run_with_the_recipes_profile_prints(preset, tiny_model_8_heads, tmp_path):
    """docs/sizing.md's "Recipes" row (sizing.recipe_estimates, which tests/test_docs.py checks the
    page against) is the sizing line of the recipe's own dry run with its own profile: for the data
    it is sized for (prompts.max_samples conversations) and for the shipped prompts, on the target's
    shape (its config.json), the train job's GPUs as the profile sets them."""
    from draftline.planning import sizing
    from draftline.planning.sizing.estimate import gpu_groups

    name = f"config/presets/{preset}.yaml"
    recipe, estimates = sizing.RECIPES[name], sizing.recipe_estimates(REPO, name)
    config = yaml.safe_load((REPO / name).read_text())
    config["target"]["model"] = _target_folder(tmp_path / "target", tiny_model_8_heads, recipe.shape)
    profile = ("--workflow-profile", str(REPO / recipe.profile))
    held_out = config["prompts"]["validation"] + config["prompts"]["test"]
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "answer"}]}
            for i in range(config["prompts"]["max_samples"] + held_out)]
    # as the recipe's command runs in a clone: config/config.yaml under the preset, the shipped and evaluated sets
    (tmp_path / "config").mkdir()
    shutil.copy(REPO / "config/config.yaml", tmp_path / "config/config.yaml")
    shutil.copytree(REPO / "resources/prompts", tmp_path / "resources/prompts")
    (tmp_path / "resources/prompts/sized.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def sizing_line(source: str) -> str:
        """The plan's estimate: its headline and the indented lines under it, as sizing.describe writes them."""
        config["prompts"]["sources"] = [source]
        write_config(tmp_path, config)
        lines = snakemake(tmp_path, "-n", *profile).stderr.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("draftline: sizing for ")]
        assert len(starts) == 1, "\n".join(lines[-40:])
        block = [lines[starts[0]]]
        block += itertools.takewhile(lambda line: line.startswith("draftline:   "), lines[starts[0] + 1:])
        return "\n".join(line.removeprefix("draftline: ") for line in block)

    for source, est in (("resources/prompts/sized.jsonl", estimates["H200"]),
                        ("resources/prompts/default.jsonl", estimates["shipped"])):
        line = sizing_line(source)
        expected = sizing.describe({**est, "target": "target"})
        assert expected in line, "\n".join((line, expected))
    assert estimates["H200"]["conversations"] == config["prompts"]["max_samples"]
    # one total per group of GPU kinds alike (gpu_groups): the H200s' group's above, each other group's after it
    line = sizing_line("resources/prompts/sized.jsonl")
    for group in gpu_groups():
        total = sizing.line._hours(sum(estimates[group.kinds[0]]["device_hours"].values()))
        assert (f"on {group.label}: total {total} ({group.basis})" in line) == ("H200" not in group.kinds), line
    assert [group.kinds for group in gpu_groups()] == [("H200", "H100")]  # alike: no H100 total
    assert "on H100s: total " not in line
    assert sizing.recipe_train_gpus(REPO, name) == RECIPES[preset][2]


def test_sizing_table_matches_the_measured_8b_rates():
    """The estimate reproduces the measurements it is built on for the 8B shape: extraction with the
    transformers backend 29.5k tokens/s at 0.54 of the limit (one H200), with the vLLM backend 39.8k
    at 0.726 (one H100, h100_8b_vllm_rates_256rows), vLLM's greedy decoding 16.1k tokens/s at the
    recipe's batch of 256 (the same H100 record), training 28.1k tokens/s (one H200), and the file
    size per token. The H100 record's fractions are of its own matmul rate (796.0 TFLOP/s); the
    estimate applies them to H200_MATMUL_FLOPS (787.8), the same chip's, within 1.1%."""
    from dataclasses import replace

    from draftline.planning import sizing

    plan = sizing.Plan(conversations=96, max_seq_len=2052, max_new_tokens=0, epochs=1, eval_prompts=0,
                       eval_new_tokens=0, regenerate=False, hidden_states_backend="transformers")
    est = sizing.estimate(sizing.LLAMA_8B, plan)
    assert est["rates_tokens_per_s"]["extraction"] == pytest.approx(29_500, rel=0.02)
    assert est["rates_tokens_per_s"]["training"] == pytest.approx(28_138)
    assert est["bytes_per_token"] == 32_776  # measured: 4 layers x 4096 x 2 B + the token id
    assert sizing.LLAMA_8B.active_linear == 6_979_321_856  # docs/sizing.md's P_active
    assert est["device_hours"]["regeneration"] == 0

    # the H100 record's rows: 14.50 GFLOP per token (mean row 2,022 tokens, token-weighted 2,066)
    vllm = sizing.estimate(sizing.LLAMA_8B, replace(plan, max_seq_len=2066, hidden_states_backend="vllm"),
                           gpu="H100")
    assert sizing.LLAMA_8B.forward_flops(2066) == pytest.approx(14.50e9, rel=0.01)
    assert vllm["rates_tokens_per_s"]["extraction"] == pytest.approx(39_842, rel=0.02)
    decode = sizing.DECODE_FRACTION * sizing.H200_MATMUL_FLOPS / (2 * 6_979_321_856)
    assert vllm["rates_tokens_per_s"]["regeneration"] == pytest.approx(decode)
    assert decode == pytest.approx(16_131, rel=0.02)
    # a config's plan takes its backend: the schema's default vllm, or transformers where set
    config = sizing.recipe_config(REPO, "config/presets/dense_8b.yaml")
    assert sizing.plan_from_config(config, 100).hidden_states_backend == "vllm"
    config["hidden_states"]["backend"] = "transformers"
    assert sizing.plan_from_config(config, 100).hidden_states_backend == "transformers"


def test_gpu_kinds_alike_are_sized_once_and_kinds_apart_each_on_their_own(monkeypatch):
    """The H200 and the H100 have equal rates (GPUS: the same chip; decoding measured on the H100, a
    lower bound on the H200): the sizing line and docs/sizing.md print their figures once, for both
    (gpu_groups). A measurement that tells them apart (here an H100 decoding slower) gives the H100s
    their own total in the line, with its basis, and their own table and GPU-hours column on the page."""
    from dataclasses import replace

    from snakemake.utils import validate

    from draftline.planning import sizing

    config: dict = {}
    validate(config, str(REPO / "config/schema/config.schema.yaml"), set_default=True)

    def line() -> str:
        return sizing.for_config(config, sizing.SizedTarget("embedded", REPO), "cuda", 1, (1000, None))

    def tables() -> list[str]:
        page = sizing.docs_tables(REPO)
        return re.findall(r"^On (.*?) \(", page, re.M) + re.findall(r"GPU-hours \((.*?)\)", page)

    assert "  GPU time per stage on H200s and H100s " in line() and "on H100s: total" not in line()
    assert tables() == ["H200s and H100s", "H200 or H100"]

    monkeypatch.setitem(sizing.GPUS, "H100", replace(sizing.GPUS["H100"], decoding=0.7))
    h200, h100 = (sizing.config_estimate(sizing.SMOLLM2_135M, config, 1000, 1, gpu=gpu) for gpu in ("H200", "H100"))
    assert sum(h100["device_hours"].values()) > sum(h200["device_hours"].values())
    total = sizing.line._hours(sum(h100["device_hours"].values()))
    assert "  GPU time per stage on H200s " in line()
    assert f"\n  on H100s: total {total} ({sizing.GPUS['H100'].basis})" in line().replace("\n    ", " "), line()
    assert tables() == ["H200s", "H100s", "H200", "H100"]


def test_the_plan_sizes_a_config_from_its_sources_or_says_what_it_waits_for(tmp_path, monkeypatch):
    """Before the first job: the count of the sources' rows less the held-out prompts (capped at
    prompts.max_samples), the prompts job's count once it ran, or a line naming what is missing."""
    import json

    from snakemake.utils import validate

    from draftline import sources
    from draftline.planning import sizing
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"prompt": f"question {i}"} for i in range(500)]))
    config = {"prompts": {"sources": [str(rows)], "validation": 20, "test": 30}}
    validate(config, str(REPO / "config/schema/config.schema.yaml"), set_default=True)

    def line(target_kind="embedded", target_dir=tmp_path, device="cpu", summary=None):
        planned = sizing.planned_training_rows(config, summary)
        return sizing.for_config(config, sizing.SizedTarget(target_kind, target_dir), device, 1, planned)

    assert re.search(r"sizing for SmolLM2-135M on cpu: 450 training conversations x", line()), line()

    config["prompts"]["max_samples"] = 100
    assert " 100 training conversations x" in line()
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"train": 77}))
    assert " 77 training conversations x" in line(summary=summary)

    config["prompts"]["max_samples"] = None
    monkeypatch.setattr(sources.json_files, "COUNT_JSON_LIST_MAX_BYTES", 100)
    text = line()
    assert text.startswith(f"no sizing estimate before the first job: {rows}: a JSON list of ") and \
        text.endswith("set prompts.max_samples to size the run before the prompts job"), text
    text = line("hub", tmp_path / "not-downloaded", "cuda")
    assert text.startswith("no sizing estimate before the first job: the target's config.json is not in "), text


def test_the_moe_recipe_runs_expert_parallel_and_its_sizing_says_so(tmp_path):
    """config/presets/moe_235b.yaml sets vllm.enable_expert_parallel; the sizing line of an MoE
    target on CUDA says whether it is on, and that its rates do not model it."""
    import json

    from snakemake.utils import validate

    from draftline.planning import sizing

    recipe = yaml.safe_load((REPO / "config/presets/moe_235b.yaml").read_text())
    assert recipe["vllm"]["enable_expert_parallel"] is True
    target = tmp_path / "moe"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 512, "vocab_size": 1000, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 128}))
    config = {"vllm": {"enable_expert_parallel": True}}
    validate(config, str(REPO / "config/schema/config.schema.yaml"), set_default=True)
    text = sizing.for_config(config, sizing.SizedTarget("local", target, "tiny-moe"), "cuda", 1, (100, None))
    assert "MoE with expert parallelism on (vllm.enable_expert_parallel)" in text, text
    config["vllm"]["enable_expert_parallel"] = False
    assert "expert parallelism off" in sizing.for_config(config, sizing.SizedTarget("local", target), "cuda", 1, (100, None))


def _recipe_workdir(workdir, preset, model, **changes):
    """`preset` with the tiny model as its target and the shipped prompts in `workdir`."""
    config = yaml.safe_load((REPO / "config/presets" / f"{preset}.yaml").read_text())
    (workdir / "resources/prompts").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "resources/prompts/default.jsonl", workdir / "resources/prompts/default.jsonl")
    config["target"]["model"] = str(model)
    config["vocab"]["draft_vocab_size"] = 256
    for section, values in changes.items():
        config.setdefault(section, {}).update(values)
    write_config(workdir, config)
    return config


PLANNED = re.compile(r"draftline: planned for (\w+) \(device: (\w+)(; the jobs run on the slurm executor's nodes)?\)")


@pytest.mark.parametrize("profile, added", [
    ("slurm", ("--config", "run_name=x")),  # issue 26: any --config replaced the profile's config: ["device=cuda"]
    ("slurm_dense_8b", ("--config", "device=auto", "prompts={on_bad_row: stop}")),
    ("slurm_moe_235b", ("--set-resources", "train:mem_mb=1000")),  # replaces the profile's set-resources whole
])
def test_a_slurm_plan_is_for_cuda_whatever_the_command_line_adds(profile, added, tiny_model_8_heads, tmp_path):
    """The login node that plans has no GPU (nor has this machine); the Slurm executor's jobs run on
    its GPU nodes, so the plan is for cuda (bfloat16, Muon) however config is added. Locally the
    same command line plans for this machine (cpu)."""
    _recipe_workdir(tmp_path, "dense_8b", tiny_model_8_heads)
    target = "results/tokenized/summary.json"
    text = snakemake(tmp_path, "-n", target, "--workflow-profile", str(REPO / "profiles" / profile), *added).stderr
    assert PLANNED.search(text).groups() == ("cuda", "auto", "; the jobs run on the slurm executor's nodes"), text[-3000:]
    assert "dtype bfloat16" in text and "optimizer muon" in text
    assert re.search(r"draftline: sizing for \S+ on cuda:", text)
    if profile == "slurm":
        local = snakemake(tmp_path, "-n", target, *added).stderr
        assert PLANNED.search(local).groups() == ("cpu", "auto", None), local[-3000:]


def test_cpu_under_slurm_is_planned_only_when_meant_twice(tiny_model_8_heads, tmp_path):
    _recipe_workdir(tmp_path, "dense_8b", tiny_model_8_heads)
    profile = ("--workflow-profile", str(REPO / "profiles" / "slurm_dense_8b"))
    stopped = snakemake(tmp_path, "-n", *profile, "--config", "device=cpu", check=False)
    text = stopped.stdout + stopped.stderr
    assert stopped.returncode != 0
    assert "device: cpu with the slurm executor: every job would run on the CPU of a cluster node" in text
    assert "--config device=cpu cpu_on_cluster=True" in text
    assert not re.search(r"^rule \w+:", text, re.M)  # nothing planned
    meant = snakemake(tmp_path, "-n", *profile, "--config", "device=cpu", "cpu_on_cluster=True").stderr
    assert PLANNED.search(meant).groups() == ("cpu", "cpu", "; the jobs run on the slurm executor's nodes")
    assert re.search(r"draftline: sizing for \S+ on cpu:", meant)


# A Slurm that submits nothing: sbatch records its arguments (one file per call, NUL-separated)
# and fails, so the run stops after the first submission; sacct (the account guess) knows no
# account and sinfo offers one default partition.
FAKE_SLURM = {
    "sbatch": '#!/bin/sh\nprintf \'%s\\0\' "$@" > "$SBATCH_CALLS/$(date +%s%N)"\n'
              'echo "sbatch: error: a test: nothing was submitted" >&2\nexit 1\n',
    "sacct": "#!/bin/sh\nexit 0\n",
    "sinfo": '#!/bin/sh\necho PARTITION\necho "gpu*"\n',
}


def test_a_tp8_vllm_job_asks_sbatch_for_its_8_gpus_on_one_node(tiny_model_8_heads, tmp_path):
    """The MoE recipe's regeneration shard (target.tensor_parallel_size 8) submitted through the
    Slurm plugin with the recipe's profile, its site settings switched on as the comments say:
    sbatch gets --gpus=8 with --nodes=1 (the rule's own), the GPU type as a node constraint and
    --exclusive, each written once in the profile and given to every GPU rule."""
    workdir, profile, bin_dir, calls = (tmp_path / name for name in ("run", "profile", "bin", "calls"))
    for folder in (workdir, profile, bin_dir, calls):
        folder.mkdir()
    _recipe_workdir(workdir, "moe_235b", tiny_model_8_heads)
    text = (REPO / "profiles/slurm_moe_235b/config.yaml").read_text()
    for commented, on in (('  # constraint: "h200"', '  constraint: "h200"'),
                          ("  # slurm_extra: \"'--exclusive'\"", "  slurm_extra: \"'--exclusive'\"")):
        assert text.count(commented) == 1, commented  # one place in the profile
        text = text.replace(commented, on)
    (profile / "config.yaml").write_text(text)
    for name, script in FAKE_SLURM.items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    # the shard's inputs, as if made earlier (no metadata: only the shard is planned)
    for name in ("prompts", "validation", "test", "rejects"):
        (workdir / "results/prompts").mkdir(parents=True, exist_ok=True)
        (workdir / f"results/prompts/{name}.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    (workdir / "results/prompts/summary.json").write_text(json.dumps({"train": 465}))
    (workdir / "results/regenerated").mkdir(parents=True)
    (workdir / "results/regenerated/settings.json").write_text("{}\n")

    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SBATCH_CALLS=str(calls))
    out = snakemake(workdir, "--workflow-profile", str(profile), "--retries", "0",
                    "--slurm-init-seconds-before-status-checks", "1", "results/regenerated/shard_0",
                    check=False, env=env)
    assert out.returncode != 0 and "a test: nothing was submitted" in out.stderr + out.stdout
    submitted = [path.read_bytes().decode().split("\0")[:-1] for path in sorted(calls.iterdir())]
    assert len(submitted) == 1, submitted
    args = submitted[0]
    assert "--comment" in args and args[args.index("--comment") + 1] == "rule_regenerate_shard_wildcards_0"
    for expected in ("--gpus=8", "--nodes=1", "--exclusive", "--cpus-per-gpu=8", "--requeue"):
        assert expected in args, (expected, args)
    assert args[args.index("-C") + 1] == "h200"
    assert args[args.index("--mem") + 1] == "768000" and args[args.index("-t") + 1] == "240"
    assert args[args.index("-p") + 1] == "gpu"  # sinfo's default partition
    # the job's own snakemake plans as the login node did: the same config, Slurm's remote mode
    wrap = next(a for a in args if a.startswith("--wrap="))
    assert "--mode 'remote'" in wrap and " --config " not in wrap  # no device handed over: decided there again


def test_a_preset_in_a_run_folder_reads_paths_from_the_run_folder(tiny_model_8_heads, tmp_path):
    """`--directory runs/x` with a preset: its relative paths are read from the run folder; one that
    is only in the workflow's folder stops the plan naming the path looked at and the one to write."""
    repo = copy_workflow(tmp_path / "checkout")
    run_folder = repo / "runs" / "x"
    run_folder.mkdir(parents=True)
    mine = tmp_path / "mine.yaml"  # the user's changes on top of the preset
    mine.write_text(yaml.safe_dump({"target": {"model": str(tiny_model_8_heads)}, "vocab": {"draft_vocab_size": 256}}))
    command = [SNAKEMAKE, "--directory", "runs/x", "--configfile", str(REPO / "config/presets/dense_8b.yaml"), str(mine),
               "-n"]
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert (f"prompts.sources: resources/prompts/default.jsonl is not in the working folder (looked at "
            f"{run_folder}/resources/prompts/default.jsonl)") in text, text[-3000:]
    assert "Write ../../resources/prompts/default.jsonl (or an absolute path)" in text
    # the file in the run folder: the same command plans there
    (run_folder / "resources/prompts").mkdir(parents=True)
    shutil.copy(REPO / "resources/prompts/default.jsonl", run_folder / "resources/prompts/default.jsonl")
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "draftline: sizing for " in result.stderr and not (repo / "results").exists()


def test_a_renamed_column_stops_the_recipes_dry_run(tiny_model_8_heads, tmp_path):
    """The recipes skip bad rows (prompts.on_bad_row: skip), but a Parquet source whose rows are
    all unusable (its conversations under another column name) stops the dry run, naming the
    source and its first row, before any job."""
    import datasets

    rows = [{"chat": [{"role": "user", "content": f"question {i}"}]} for i in range(10)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "chats.parquet"))
    _recipe_workdir(tmp_path, "dense_8b", tiny_model_8_heads, prompts={"sources": ["chats.parquet"]})
    out = snakemake(tmp_path, "-n", "--workflow-profile", str(REPO / "profiles/slurm_dense_8b"), check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert ("prompts.sources: chats.parquet: none of its first 5 rows can be used, so prompts.on_bad_row: skip "
            "would reject the whole source; the first: chats.parquet[0]: none of the fields messages, "
            "conversations, prompt (the row has: chat)") in text, text[-3000:]
    assert not re.search(r"^rule \w+:", text, re.M)


def test_the_device_a_plan_is_for():
    """Off a cluster, auto is this machine's; on one, auto and cuda are cuda and cpu needs the opt-in."""
    from draftline.planning.cluster import cluster_device, jobs_leave_this_machine, snakemake_executor
    from draftline.planning.rule_params import PlanError

    assert [jobs_leave_this_machine(e) for e in ("slurm", "local", "dryrun", "touch", None)] == [True] + [False] * 4
    assert snakemake_executor() is None  # not under snakemake's command line
    assert cluster_device("cuda", False, False, None) == "cuda"
    assert cluster_device("cpu", False, False, None) == "cpu"
    assert cluster_device("auto", True, False, "slurm") == cluster_device("cuda", True, False, "slurm") == "cuda"
    assert cluster_device("cpu", True, True, "slurm") == "cpu"
    with pytest.raises(PlanError, match=r"^device: cpu with the slurm executor: .* --config device=cpu cpu_on_cluster=True"):
        cluster_device("cpu", True, False, "slurm")


def test_the_cpu_estimate_bounds_the_embedded_defaults_recorded_stage_times(monkeypatch):
    """The dry run's sizing is what a user budgets by, so it must bound: for the default config
    (the embedded target on the CPU), each stage's recorded wall time (the fresh-clone run in
    benchmarks/results/default_acceptance.json, idle machine) is under the plan's estimate of one
    of its jobs. Evaluation is priced at speculative-decoding rates and counts the named sets."""
    import json

    from snakemake.utils import validate

    from draftline.planning import sizing

    monkeypatch.chdir(REPO)  # the config's relative paths (the prompts, the named sets)
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    validate(config, str(REPO / "config/schema/config.schema.yaml"), set_default=True)
    rows, why_not = sizing.planned_training_rows(config)
    assert rows, why_not
    plan = sizing.plan_from_config(config, rows, 1, "cpu")
    assert plan.eval_prompts > config["prompts"]["validation"] + config["prompts"]["test"]  # the named sets count
    per_job = {stage: hours * 3600 for stage, hours in sizing.estimate(sizing.SMOLLM2_135M, plan, "cpu")["wall_hours"].items()}
    recorded = json.loads((REPO / "benchmarks/results/default_acceptance.json").read_text())["stage_seconds"]
    measured = {
        "regeneration": max(s for job, s in recorded.items() if job.startswith("regenerate/shard_")),
        "extraction": max(s for job, s in recorded.items() if job.startswith("hidden_states/shard_")),
        "training": recorded["train"],
        "evaluation": recorded["evaluate"],
    }
    over = {stage: (seconds, round(per_job[stage])) for stage, seconds in measured.items() if seconds > per_job[stage]}
    assert not over, f"recorded seconds over the plan's estimate (recorded, estimate): {over}"
    # the figure to plan by beside the bound: the share of each bound this run took
    shares = {stage: round(seconds / per_job[stage], 2) for stage, seconds in measured.items()}
    assert shares == sizing.EXPECTED_SHARE, f"sizing.EXPECTED_SHARE is not the record's: {shares}"


def test_the_sizing_adds_the_filesystems_time_to_write_and_read_the_hidden_states():
    """sizing.filesystem_gb_per_s: extraction writes the hidden states once and training reads
    them once per epoch at that rate, and each vLLM job loads the weights at it; hidden_states.mode
    online has no files to write or read."""
    from snakemake.utils import validate

    from draftline.planning import sizing
    from draftline.settings import default

    def estimate(**blocks):
        config = {"prompts": {"sources": ["x.jsonl"]}, "train": {"epochs": 2}, **blocks}
        validate(config, str(REPO / "config/schema/config.schema.yaml"), set_default=True)
        return sizing.estimate(sizing.LLAMA_8B, sizing.plan_from_config(config, 10_000, 1, "cuda"), "cuda")

    fast, slow = estimate(sizing={"filesystem_gb_per_s": 10.0}), estimate(sizing={"filesystem_gb_per_s": 1.0})
    hidden = fast["hidden_state_bytes"]
    weights = sizing.LLAMA_8B.weights_bytes
    extraction = slow["wall_hours"]["extraction"] - fast["wall_hours"]["extraction"]
    training = slow["wall_hours"]["training"] - fast["wall_hours"]["training"]
    jobs = default("hidden_states", "shards")  # each extraction job writes its share, loads the weights once
    assert extraction * 3600 == pytest.approx(hidden * 0.9e-9 / jobs + weights * 0.9e-9)
    assert training * 3600 == pytest.approx(2 * hidden * 0.9e-9)  # two epochs, one job
    assert "at 1 GB/s (sizing.filesystem_gb_per_s" in sizing.describe(slow)
    online = estimate(sizing={"filesystem_gb_per_s": 1.0}, hidden_states={"mode": "online"})
    assert online["io_hours"] == {} and online["wall_hours"]["training"] < slow["wall_hours"]["training"]


def test_multi_turn_regeneration_is_bounded_by_its_turns_and_context():
    """Regeneration answers every user turn, each prompt being the conversation so far: the
    estimate counts an answer per user turn (once the prompts job counted them) but no more than
    fit a conversation's context, and prefills every turn's prompt; a dry run before the prompts
    job says it took one turn per conversation."""
    from draftline.planning import sizing

    def regeneration(user_turns):
        plan = sizing.Plan(1000, 2048, 512, 1, 0, 128, user_turns=user_turns, context_len=2048)
        est = sizing.estimate(sizing.LLAMA_8B, plan)
        return est, est["device_hours"]["regeneration"]

    single, single_h = regeneration(None)
    assert single["generated_tokens"] == 1000 * 512 and single["prefilled_tokens"] == 1000 * 2048
    three, three_h = regeneration(3000)  # three user turns a conversation: three answers, three prefills
    assert three["generated_tokens"] == 3000 * 512 and three["prefilled_tokens"] == 3000 * 2048
    start_h = single["vllm_start_seconds"] / 3600  # the job's engine start, the same for both
    assert three_h - start_h > 2.5 * (single_h - start_h)
    many, _ = regeneration(10_000)  # ten turns of 512 do not fit 2,048 tokens: the context bounds the answers
    assert many["generated_tokens"] == 1000 * 2048
    assert "one answer per conversation until the prompts job counts the user turns" in sizing.describe(single)
    assert "3,000 user turns answered" in sizing.describe(three)


def test_the_prompts_job_counts_the_user_turns_the_sizing_reads(tmp_path):
    from draftline.planning import sizing
    from draftline.stages.prompts import PromptsSettings, collect_prompts

    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"},
                          {"role": "user", "content": "more"}]} for i in range(6)]
    rows += [{"prompt": f"single {i}"} for i in range(4)]
    source = tmp_path / "mixed.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    collected = collect_prompts([str(source)], PromptsSettings(validation=0, test=0))
    assert collected.summary["train_user_turns"] == 6 * 2 + 4
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(collected.summary))
    assert sizing.planned_user_turns(summary) == 16
    assert sizing.planned_user_turns(tmp_path / "missing.json") is None


@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_each_recipes_profile_gives_a_job_the_time_its_plan_bounds(preset):
    """A Slurm job killed at its time limit costs a retry: each recipe's profile gives its
    regeneration, extraction, training and evaluation jobs at least the plan's wall-time bound of
    one job for the data the recipe is sized for, on the slower of the GPU kinds (H100)."""
    from draftline.planning import sizing

    profile = yaml.safe_load((REPO / "profiles" / RECIPES[preset][0] / "config.yaml").read_text())["set-resources"]
    estimates = sizing.recipe_estimates(REPO, f"config/presets/{preset}.yaml")  # with the profile's train GPUs
    wall = {stage: max(estimates[gpu]["wall_hours"][stage] for gpu in sizing.GPUS) * 60
            for stage in ("regeneration", "extraction", "training", "evaluation")}
    rules = {"regeneration": "regenerate_shard", "extraction": "hidden_states_shard", "training": "train",
             "evaluation": "evaluate_set"}
    short = {stage: (minutes, profile[rules[stage]]["runtime"]) for stage, minutes in wall.items()
             if eval(str(profile[rules[stage]]["runtime"]), {"attempt": 1}) < minutes}
    assert not short, f"runtime (minutes, attempt 1) under the plan's bound of one job: {short}"


def test_command_line_values_take_the_schemas_types_and_a_bad_one_names_its_key():
    """What Snakemake's --config parser hands over (nested values as strings, a top-level number as
    a number) becomes what the schema says each key is; a value of no allowed type is an error
    naming the key, and a validation error about a --config key says it came from there."""
    import jsonschema
    from snakemake.exceptions import WorkflowError

    from draftline.settings.command_line import CommandLineError, command_line_config, validation_error

    config = recipe_config_default()
    given = {"tokenize": {"max_seq_len": "512"}, "train": {"lr": "3e-4", "fsdp": "true"}, "run_name": 2026,
             "hidden_states": {"layer_ids": ["2", "9", "20"]}, "evaluate": {"prompt_sets": {"code": "null"}},
             "vllm": {"engine_args": {"block_size": "32"}}}
    command_line_config(config, given)
    assert config["tokenize"]["max_seq_len"] == 512 and config["train"]["lr"] == 3e-4 and config["train"]["fsdp"] is True
    assert config["run_name"] == "2026"  # a string key stays a string
    assert config["hidden_states"]["layer_ids"] == [2, 9, 20] and config["evaluate"]["prompt_sets"]["code"] is None
    assert config["vllm"]["engine_args"] == {"block_size": 32}
    assert config["train"]["epochs"] == 4  # a key not given keeps the config file's value

    with pytest.raises(CommandLineError, match=r"--config train\.epochs: 'four' is not a valid train\.epochs"):
        command_line_config(recipe_config_default(), {"train": {"epochs": "four"}})

    def failing(value, path):  # as snakemake.utils.validate raises it
        try:
            try:
                raise jsonschema.ValidationError(f"{value!r} was unexpected", path=path, validator="additionalProperties")
            except jsonschema.ValidationError:
                raise WorkflowError("Error validating config file.") from None
        except WorkflowError as error:
            return error

    assert "--config" in validation_error(failing("epochz", ["train"]), {"train": {"epochz": "3"}})
    assert validation_error(failing("epochz", ["train"]), {"train": {"lr": "1"}}) is None  # the file's key


def recipe_config_default() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_commands_that_run_no_job_never_stop_at_the_device(tiny_model_8_heads, tmp_path):
    """In the MoE recipe's run folder without its profile the plan is for this CPU machine, where
    vllm.enable_expert_parallel is refused: a dry run stops there, but --unlock, --cleanup-metadata
    and --list-changes, which run no job, say it as a note and do what they were asked."""
    _recipe_workdir(tmp_path, "moe_235b", tiny_model_8_heads)
    refused = "vllm.enable_expert_parallel: true is refused on CPU"
    stopped = snakemake(tmp_path, "-n", check=False)
    assert stopped.returncode != 0 and refused in stopped.stdout + stopped.stderr
    lock = tmp_path / ".snakemake" / "locks"
    lock.mkdir(parents=True)
    (lock / "0.input.lock").write_text("a killed run's lock\n")
    for command in (["--unlock"], ["--cleanup-metadata", "results/prompts/summary.json"], ["--list-changes", "input"]):
        out = snakemake(tmp_path, *command, check=False)
        assert f"draftline: note: {refused}" in out.stderr and f"(not a stop for {command[0]}, which runs no job)" in out.stderr
        assert "draftline: sizing" not in out.stderr
        if command[0] == "--cleanup-metadata":  # Snakemake's own answer: nothing recorded for it yet
            assert "the metadata was not present" in out.stdout + out.stderr
        else:
            assert out.returncode == 0, out.stdout[-2000:]
    assert not list(lock.iterdir())  # unlocked


def test_no_job_command_reads_snakemakes_flags():
    from draftline.planning.plan import no_job_command

    assert no_job_command(["snakemake", "--cores", "all", "--unlock"]) == "--unlock"
    assert no_job_command(["snakemake", "--lc=params"]) == "--lc"
    assert no_job_command(["snakemake", "-n", "results/checkpoint/final"]) is None


def test_the_sizing_line_says_which_figure_is_the_bound_and_how_long_the_weights_take_to_load():
    """The MoE target's 470 GB at the assumed 1 GB/s take about 8 minutes per vLLM job, which the
    line names; its total is called a bound, with the figure to plan by beside it."""
    from draftline.planning import sizing

    plan = sizing.Plan(10_000, 4096, 2048, 3, 100, 128, gpus_per_vllm_job=8, filesystem_bytes_per_s=1e9,
                       eval_headline_prompts=50)
    est = sizing.estimate(sizing.QWEN3_235B, plan)
    text = sizing.describe(est)
    engine = est["vllm_engine_seconds"]  # the measured engine start, less the 8B's weights' load
    assert 0 < engine < est["vllm_start_seconds"] == pytest.approx(engine + sizing.QWEN3_235B.weights_bytes / 1e9)
    assert (f"each vLLM job starts in {est['vllm_start_seconds'] / 60:.0f} min (included above): the weights (470.1 GB) "
            f"load at 1 GB/s (sizing.filesystem_gb_per_s), beside {engine:.0f} s of the engine's own start") in text.replace("\n    ", " ")
    bound = sum(est["device_hours"].values())
    expected = sum(h * sizing.EXPECTED_SHARE[k] for k, h in est["device_hours"].items())
    assert re.search(rf"^    total \(a bound\) +{bound:.1f} h +[\d.]+ h$", text, re.M), text
    assert f"\n  expected about {expected:.1f} h, " in text
