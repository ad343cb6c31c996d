"""Several targets side by side (one run folder each, `--directory runs/<name>`), and a draft
whose config.json names its target by hub id, not by the local path it was trained from (vLLM
serving such a draft: tests/test_evaluate.py, whose trained draft names its target that way)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import yaml
from workflow import (
    AFTER_TOKENIZE,
    REGENERATION,
    REPO,
    SNAKEMAKE,
    copy_run,
    copy_workflow,
    fake_finished_run,
    planned_jobs,
    snakemake,
    write_config,
)

TARGET = "results/lineage.json"


def make_run_folder(repo: Path, name: str, model: Path, prompts: list[str], **train) -> Path:
    """runs/<name>/ as docs/pipeline.md says: config/config.yaml inside, paths relative to the folder
    (the target is a link beside it here, the prompts a file)."""
    run = repo / "runs" / name
    (run / "config").mkdir(parents=True)
    (run / "target").symlink_to(model)
    (run / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    config = {
        "target": {"model": "target"},
        "prompts": {"sources": ["prompts.jsonl"], "validation": 1, "test": 1},
        "tokenize": {"max_seq_len": 256},
        "hidden_states": {"shards": 2},
        "vocab": {"draft_vocab_size": 256},
        "train": {"epochs": 1, **train},
    }
    (run / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=True))
    write_config(run, config)  # the test helpers also pass it as --configfile: the same values
    return run


def documented_plan(repo: Path, name: str) -> dict[str, int]:
    """Rule -> jobs that the command in docs/pipeline.md plans, run from the checkout:
    `snakemake --directory runs/<name> -n` (no --configfile: runs/<name>/config/config.yaml)."""
    result = subprocess.run([SNAKEMAKE, "--directory", f"runs/{name}", "-n", TARGET],
                            cwd=repo, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = (result.stdout + result.stderr).splitlines()
    start = next((i for i, line in enumerate(lines) if line.split()[:2] == ["job", "count"]), None)
    if start is None:
        assert "Nothing to be done" in result.stdout + result.stderr, lines[-20:]
        return {}
    counts = {}
    for row in lines[start + 2:]:
        if len(row.split()) != 2 or row.split()[0] == "total":
            break
        counts[row.split()[0]] = int(row.split()[1])
    counts.pop("all", None)
    return counts


def test_two_targets_runs_coexist_and_neither_replans_the_other(tmp_path, tiny_model, tiny_model_generation_tags):
    repo = copy_workflow(tmp_path / "checkout")
    llama = make_run_folder(repo, "llama", tiny_model, [f"Count to {i}." for i in range(6)])
    qwen = make_run_folder(repo, "qwen", tiny_model_generation_tags, [f"Name {i} colors." for i in range(6)])
    for run in (llama, qwen):  # each recorded as a real run records it (as workflow.fake_tiny_project)
        fake_finished_run(run, TARGET, repo=repo)
        snakemake(run, "--touch", "--forceall", "--cores", "1", TARGET, repo=repo)
    # each folder holds its own results, logs and Snakemake records; nothing is planned in either
    for run in (llama, qwen):
        assert (run / "results/checkpoint/final").is_dir() and (run / ".snakemake").is_dir()
        assert documented_plan(repo, run.name) == {}
    assert not (repo / "results").exists()
    # a new setting in one run replans that run only: here a chat-template variable, which
    # changes how every conversation is rendered (regeneration, tokenization, evaluation)
    config = yaml.safe_load((llama / "config/config.yaml").read_text())
    config["target"]["chat_template_kwargs"] = {"enable_thinking": False}
    (llama / "config/config.yaml").write_text(yaml.safe_dump(config))
    assert documented_plan(repo, "llama") == {**REGENERATION, **AFTER_TOKENIZE}
    assert documented_plan(repo, "qwen") == {}


HUB_ID = "acme/tiny-chat"
# final/'s records of where the draft came from, which keep the target's local path on purpose
PROVENANCE_FILES = ("draftline_provenance.json", "provenance.json")


def cache_as_hub_model(cache: Path, model: Path, repo_id: str) -> None:
    """`model`'s files as a hub snapshot in a Hugging Face cache folder (blobs, refs/main, snapshots)."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "c" * 40
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in sorted(p for p in model.iterdir() if p.is_file()):
        data = f.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(Path("../../blobs") / blob.name)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)


def test_the_final_draft_names_its_target_by_hub_id_and_still_loads(tiny_run, tmp_path, monkeypatch):
    import torch
    from huggingface_hub import constants
    from safetensors.torch import load_file

    run = copy_run(tiny_run, tmp_path / "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    target = Path(config["target"]["model"])
    config["target"]["verifier_name"] = HUB_ID
    write_config(run, config)
    # only training republishes (the run key is the same: it resumes, trains nothing again)
    assert planned_jobs(run, "results/checkpoint/final") == {"train": 1}
    snakemake(run, "--cores", "2", "results/checkpoint/final")
    final = run / "results/checkpoint/final"
    text = (final / "config.json").read_text()
    assert json.loads(text)["speculators_config"]["verifier"]["name_or_path"] == HUB_ID
    assert str(target) not in text and str(target.resolve()) not in text and str(run) not in text
    provenance = json.loads((final / "draftline_provenance.json").read_text())
    assert provenance["verifier"] == {"name": HUB_ID, "local_path": str(target.resolve())}
    # no other published file holds the local path either: speculators' run records copied
    # beside the draft name the verifier as config.json does (draftline's provenance keeps the path)
    local = (str(target).encode(), str(target.resolve()).encode())
    leaks = [p.name for p in sorted(final.rglob("*")) if p.is_file() and p.name not in PROVENANCE_FILES
             and any(path in p.read_bytes() for path in local)]
    assert leaks == [], f"{leaks} in {final} hold the target's local path {target}"
    command = (final / "train_command.txt").read_text()
    assert f"--verifier-name-or-path {HUB_ID} " in command
    # the command reruns from any checkout: no path of this one, the module by name
    assert str(REPO) not in command and "\npython -m draftline.stages.train.entry --" in command
    assert yaml.safe_load((final / "run.yaml").read_text())["train"]["verifier"]["verifier_name_or_path"] == HUB_ID

    # speculators loads the published draft by that name (from a hub cache, offline, as
    # anyone who has the target would), with the target's own embeddings
    from speculators import SpeculatorModel

    cache = tmp_path / "hf-cache"
    cache_as_hub_model(cache, target, HUB_ID)
    for key, value in (("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", True)):
        monkeypatch.setenv(key, "1" if value is True else value)
        monkeypatch.setattr(constants, key, value)
    draft = SpeculatorModel.from_pretrained(str(final))
    embed = load_file(target / "model.safetensors")["model.embed_tokens.weight"]
    assert torch.equal(draft.embed_tokens.weight.detach(), embed.to(draft.embed_tokens.weight.dtype))
