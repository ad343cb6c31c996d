"""The whole DAG through Snakemake, as a user runs it: config checks, the plan, the outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open
from workflow import REPO, fake_finished_run, load_published_draft, planned_jobs, snakemake, write_config

ALL_STAGES = {
    "target_model": 1,
    "layer_ids": 1,
    "prompts": 1,
    "regenerate_settings": 1,
    "regenerate_shard": 1,
    "regenerate_merge": 1,
    "tokenize": 1,
    "hidden_states_disk_estimate": 1,
    "hidden_states_shard": 2,
    "hidden_states_view": 1,
    "vocab": 1,
    "speculator_config": 1,
    "train": 1,
}


def default_workdir(tmp_path: Path) -> Path:
    """A scratch folder with the shipped default config and prompt set."""
    shutil.copytree(REPO / "resources" / "prompts", tmp_path / "resources" / "prompts")
    write_config(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    return tmp_path


def test_default_config_plans_the_whole_chain(tmp_path):
    workdir = default_workdir(tmp_path)
    assert planned_jobs(workdir, "results/checkpoint/final") == ALL_STAGES


@pytest.mark.parametrize(
    "change, key",
    [
        ({"train": {"epochz": 3}}, "epochz"),
        ({"train": {"epochs": "three"}}, "epochs"),
        ({"vocab": {"draft_vocab_size": 0}}, "draft_vocab_size"),
        ({"hidden_states": {"shards": 0}}, "shards"),
        ({"prompts": {"on_bad_row": "ignore"}}, "on_bad_row"),
    ],
)
def test_bad_config_stops_before_any_job_naming_the_key(tmp_path, change, key):
    workdir = default_workdir(tmp_path)
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    for section, values in change.items():
        config.setdefault(section, {}).update(values)
    write_config(workdir, config)
    result = snakemake(workdir, "-n", "results/checkpoint/final", check=False)
    assert result.returncode != 0
    assert key in result.stderr + result.stdout
    assert not (workdir / "results").exists()


def test_a_finished_run_ends_saying_where_the_draft_is_and_what_to_run_next(tmp_path):
    """After the quick start's last job the run prints where the draft is and the next command,
    not only Snakemake's "N of N steps done" (the end-of-run lines of draftline.stages.summary)."""
    workdir = default_workdir(tmp_path)
    fake_finished_run(workdir, "results/checkpoint/final")
    final = workdir / "results/checkpoint/final"
    (final / "draftline_provenance.json").write_text(json.dumps({"chosen_epoch": 2, "chosen_epoch_folder": 1,
                                                                  "epochs": 4}))
    out = snakemake(workdir, "--touch", "--cores", "1", "--forcerun", "train", "results/checkpoint/final")
    tail = out.stderr.splitlines()[-6:]
    assert "draftline: the draft is in results/checkpoint/final/ (epoch 2 of 4, eagle3)" in tail, tail
    assert "draftline: next: ./draftline snakemake --cores all (evaluation, the report's plots and results/summary.md)" in tail


def test_nested_settings_from_the_command_line_are_taken_as_the_schemas_types(tmp_path):
    """`--config 'tokenize={"max_seq_len": 512}'` reaches the plan as the integer 512 (Snakemake
    hands nested values over as strings), 3e-4 as a number; a value of the wrong type stops naming
    the key and the command line, as does an unknown key given there (docs/configuration.md)."""
    workdir = default_workdir(tmp_path)
    out = snakemake(workdir, "-n", "results/checkpoint/final", "--config", 'tokenize={"max_seq_len": 512}',
                    'train={"lr": 3e-4}', "hidden_states={layer_ids: [2, 9, 20]}")
    assert "x <= 512 tokens" in out.stderr

    bad = snakemake(workdir, "-n", "results/checkpoint/final", "--config", 'tokenize={"max_seq_len": "5x12"}',
                    check=False)
    assert bad.returncode != 0
    said = "--config tokenize.max_seq_len: '5x12' is not a valid tokenize.max_seq_len (the schema's type: integer"
    assert said in bad.stdout + bad.stderr

    unknown = snakemake(workdir, "-n", "results/checkpoint/final", "--config", 'train={"epochz": 3}', check=False)
    assert unknown.returncode != 0
    assert "Error validating the command line's --config (or a profile's config:) at train" in unknown.stdout + unknown.stderr
    assert "'epochz' was unexpected" in unknown.stdout and "Error validating config file" not in unknown.stdout


def test_dotted_nested_settings_from_the_command_line_are_taken(tmp_path):
    """`./draftline snakemake --config train.lr=3e-4 tokenize.max_seq_len=512`: the dotted form,
    which Snakemake's own parser refuses, reaches the plan as the block form does (./draftline
    rewrites it, draftline.settings.command_line.rewrite_config_args), and a bad value names its dotted key."""
    import os
    import subprocess
    import sys

    workdir = default_workdir(tmp_path)
    env = {**os.environ, "DRAFTLINE_VENV": sys.prefix, "VLLM_CPU_KVCACHE_SPACE": "1"}

    def draftline(*config: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(REPO / "draftline"), "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
             "--configfile=" + str(workdir / "config.yaml"), "-n", "results/checkpoint/final", "--config", *config],
            capture_output=True, text=True, env=env, timeout=600,
        )

    out = draftline("train.lr=3e-4", "run_name=dotted", "tokenize.max_seq_len=512", "train.epochs=2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "x <= 512 tokens" in out.stderr
    bad = draftline("train.lr=fast", "tokenize.max_seq_len=512")
    assert bad.returncode != 0
    assert "--config train.lr: 'fast' is not a valid train.lr (the schema's type: number" in bad.stdout + bad.stderr


def test_missing_prompt_source_stops_at_parse_time(tmp_path):
    workdir = default_workdir(tmp_path)
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["prompts"]["sources"] = ["data/no-such-file.jsonl"]
    write_config(workdir, config)
    result = snakemake(workdir, "-n", "results/checkpoint/final", check=False)
    assert result.returncode != 0
    assert "no-such-file.jsonl" in result.stderr + result.stdout


# The tiny_run fixture (the whole chain on the tiny model) lives in conftest.py, shared by
# test_reruns.py and test_resume.py.


def test_tiny_chain_hidden_states_match_the_dataset(tiny_run, tiny_model):
    from datasets import load_from_disk

    layer_ids = json.loads((tiny_run / "results/target/layer_ids.json").read_text())
    assert layer_ids == {"aux": [2, 4, 5], "extracted": [2, 4, 5, 8], "num_hidden_layers": 8}
    dataset = load_from_disk(str(tiny_run / "results/tokenized/dataset"))
    view = tiny_run / "results/hidden_states/all"
    assert sorted(p.name for p in view.glob("hs_*")) == sorted(f"hs_{i}.safetensors" for i in range(len(dataset)))
    for i, row in enumerate(dataset):
        with safe_open(str(view / f"hs_{i}.safetensors"), "pt") as f:
            hidden, token_ids = f.get_tensor("hidden_states"), f.get_tensor("token_ids")
        assert hidden.shape == (len(row["input_ids"]), 4, 128)
        assert hidden.dtype == torch.float32 and torch.isfinite(hidden).all()
        assert token_ids.tolist() == list(row["input_ids"])


def test_tiny_chain_vocab_maps_are_consistent(tiny_run):
    d2t = np.load(tiny_run / "results/vocab/d2t.npy")
    t2d = np.load(tiny_run / "results/vocab/t2d.npy")
    assert d2t.shape == (256,) and t2d.shape == (512,)
    selected = d2t + np.arange(256)
    assert np.all(np.diff(selected) > 0)
    assert t2d.sum() == 256 and np.flatnonzero(t2d).tolist() == selected.tolist()


def test_tiny_chain_config_and_checkpoint(tiny_run, tiny_model):
    from speculators.models.eagle3 import Eagle3DraftModel

    config = json.loads((tiny_run / "results/config/config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["draft_vocab_size"] == 256
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["target_hidden_size"] == 128 or config["transformer_layer_config"]["hidden_size"] == 128

    final = tiny_run / "results/checkpoint/final"
    with safe_open(str(final / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["d2t"] == (256,) and shapes["t2d"] == (512,)
    assert shapes["fc.weight"] == (128, 3 * 128)
    assert shapes["lm_head.weight"] == (256, 128)
    model = load_published_draft(final)
    assert isinstance(model, Eagle3DraftModel)
    assert model.config.draft_vocab_size == 256


def test_tiny_chain_second_run_plans_nothing(tiny_run):
    assert planned_jobs(tiny_run, "results/checkpoint/final") == {}


def test_tiny_chain_job_logs_leave_out_repeated_noise(tiny_run):
    """vLLM says why Triton is off in every process and speculators draws a bar per epoch: the
    job logs leave both out (logs.NOISE, train.TRAINER_NOISE) and keep draftline's progress."""
    import re

    from draftline.runtime.logs import NOISE
    from draftline.stages.train import TRAINER_NOISE

    # the server log is the vLLM server's own output (online mode), not a job's log
    logs = {p: p.read_text(errors="replace") for p in (tiny_run / "logs").rglob("*.log") if p.name != "train_vllm_server.log"}
    engine_jobs = [p for p in logs if p.parent.name in ("regenerate", "hidden_states") or p.name == "evaluate.log"]
    assert len(engine_jobs) >= 4, sorted(map(str, logs))  # every kind of vLLM job is among them
    for path, text in logs.items():
        for noise in [start for _, start in NOISE] + list(TRAINER_NOISE):
            assert noise not in text, f"{path}: {noise!r}"
    assert re.search(r"\[draftline\] step \d+/\d+ \(epoch \d+/\d+\)", logs[tiny_run / "logs/train.log"])
    # extraction's engine core runs in a process of its own (as every engine's does on CUDA): its
    # lines reach the job's log too (logs.send_vllm_logs_to)
    extraction = [text for path, text in logs.items() if path.parent.name == "hidden_states" and "shard" in path.name]
    assert extraction and all("vllm.v1.engine.core init engine (profile, create kv cache" in text for text in extraction)
