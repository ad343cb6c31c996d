"""Bad input and faults, as a user meets them through Snakemake: errors before any expensive job,
the hidden states' disk estimate and limit, a corrupted artifact re-extracting only its shard,
no remote code unless switched on, no partial output under a final name.

The workflow here runs only cheap jobs (prompts, layer ids, tokenization, the disk estimate) on
the tiny model with regeneration off; no vLLM engine is started.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file
from workflow import REPO, planned_jobs, snakemake, write_config

from draftline.artifacts import hidden_states as hsf
from draftline.artifacts.hidden_states import validate_hidden_states
from draftline.stages import hidden_states as hs

CONVERSATIONS = [
    [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    for q, a in [
        ("What is the capital of France?", "Paris."), ("Name a prime number.", "Seven."),
        ("Say hello.", "Hello there!"), ("What is 2 + 2?", "Four."), ("Name a color.", "Blue."),
        ("Count to three.", "One, two, three."), ("Name a fruit.", "An apple."),
        ("What does a CPU do?", "It runs programs."),
    ]
]


def tiny_config(tiny_model, **changes) -> dict:
    config = {
        "target": {"model": str(tiny_model)},
        "prompts": {"sources": ["prompts.jsonl"], "validation": 1, "test": 1},
        "regenerate": {"enabled": False},
        "tokenize": {"max_seq_len": 256},
        # a random tiny model on answers it did not write: its next-token agreement is noise
        # (benchmarks/results/hidden_state_fidelity.md), so only the fidelity layer checks apply
        "hidden_states": {"shards": 2, "fidelity": {"min_top1": 0}},
        "vocab": {"draft_vocab_size": 256},
        "train": {"epochs": 1, "total_seq_len": 512},
    }
    for section, values in changes.items():
        config.setdefault(section, {}).update(values)
    return config


def tiny_workdir(path: Path, tiny_model, lines: list[str] | None = None, **changes) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if lines is None:
        lines = [json.dumps({"messages": m}) for m in CONVERSATIONS]
    (path / "prompts.jsonl").write_text("".join(line + "\n" for line in lines))
    write_config(path, tiny_config(tiny_model, **changes))
    return path


def output(result) -> str:
    return result.stdout + result.stderr


def started_jobs(workdir: Path) -> set[str]:
    """Rules that started a job (each writes its log)."""
    return {p.relative_to(workdir / "logs").with_suffix("").as_posix() for p in (workdir / "logs").rglob("*.log")}


# --- config and model errors at parse time -----------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hidden_states": {"layer_ids": [2, 8]}}, r"hidden_states.layer_ids = \[2, 8\]: \[8\] out of range; the target has 8 layers"),
        ({"vocab": {"draft_vocab_size": 600}}, r"vocab.draft_vocab_size = 600 is larger than the target's vocabulary of \d+"),
        ({"tokenize": {"max_seq_len": 2048}}, r"tokenize.max_seq_len = 2048 is above the target's maximum of 1024"),
        ({"hidden_states": {"shards": 7}, "prompts": {"max_samples": 6}}, r"hidden_states.shards = 7 is more than prompts.max_samples = 6"),
    ],
    ids=["layer-ids", "draft-vocab", "max-seq-len", "shards"],
)
def test_config_beyond_the_targets_shape_stops_at_parse_time(tiny_model, tmp_path, changes, message):
    workdir = tiny_workdir(tmp_path, tiny_model, **changes)
    result = snakemake(workdir, "-n", "results/checkpoint/final", check=False)
    assert result.returncode != 0
    assert re.search(message, output(result)), output(result)[-3000:]
    assert not (workdir / "results").exists()


def _model_copy(tiny_model, dst: Path, drop=(), template=True) -> Path:
    shutil.copytree(tiny_model, dst)
    for name in drop:
        (dst / name).unlink()
    if not template:
        cfg = json.loads((dst / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
        (dst / "chat_template.jinja").unlink(missing_ok=True)
    return dst


@pytest.mark.parametrize(
    "drop, template, message",
    [
        (["config.json"], True, r"config.json is missing; point target.model at a Hugging Face model folder"),
        (["tokenizer.json"], True, r"no tokenizer .*save the tokenizer there"),
        ([], False, r"no chat template .*Set target.chat_template"),
    ],
    ids=["no-config", "no-tokenizer", "no-chat-template"],
)
def test_unusable_model_folder_stops_before_any_job(tiny_model, tmp_path, drop, template, message):
    model = _model_copy(tiny_model, tmp_path / "model", drop, template)
    workdir = tiny_workdir(tmp_path / "run", model)
    result = snakemake(workdir, "-n", "results/checkpoint/final", check=False)
    assert result.returncode != 0
    assert re.search(message, output(result)) and str(model) in output(result), output(result)[-3000:]
    assert not (workdir / "results").exists()


def test_chat_template_override_makes_a_folder_without_one_usable(tiny_model, tmp_path):
    model = _model_copy(tiny_model, tmp_path / "model", template=False)
    workdir = tiny_workdir(tmp_path / "run", model)
    (workdir / "chatml.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["target"]["chat_template"] = str(workdir / "chatml.jinja")
    write_config(workdir, config)
    assert planned_jobs(workdir, "results/tokenized/summary.json") == {"target_model": 1, "prompts": 1, "tokenize": 1}


# --- prompts: a bad file stops the workflow before regeneration --------------------------------


def test_bad_prompt_line_stops_the_workflow_before_any_expensive_job(tiny_model, tmp_path):
    lines = [json.dumps({"messages": m}) for m in CONVERSATIONS[:2]] + ['{"messages": [}']
    workdir = tiny_workdir(tmp_path, tiny_model, lines, regenerate={"enabled": True})
    result = snakemake(workdir, "--cores", "1", "results/checkpoint/final", check=False)
    assert result.returncode != 0
    text = output(result)
    # The first line is fine, so this is the prompts job's full check: file, line, what to do.
    assert re.search(r"prompts.jsonl:3: malformed JSON .*\(fix: .+\)", text), text[-4000:]
    # Only cheap jobs that do not need the prompts may have run beside it.
    assert started_jobs(workdir) <= {"prompts", "layer_ids", "speculator_config"}
    assert not (workdir / "results" / "regenerated").exists()
    assert not (workdir / "results" / "hidden_states").exists()


# --- disk: estimate after tokenization, limit before extraction -------------------------------


@pytest.fixture(scope="module")
def tokenized(tiny_model, tmp_path_factory):
    """A run up to the disk estimate: first with a 1 kB limit (it must stop), then without."""
    workdir = tiny_workdir(tmp_path_factory.mktemp("tokenized"), tiny_model,
                           hidden_states={"max_disk_gb": 1e-6})
    limited = snakemake(workdir, "--cores", "2", "results/hidden_states/all", check=False)
    jobs_started = started_jobs(workdir)
    write_config(workdir, tiny_config(tiny_model))
    snakemake(workdir, "--cores", "2", "results/hidden_states/disk_estimate.json")
    return workdir, limited, jobs_started


def test_disk_limit_stops_the_run_before_extraction(tokenized):
    workdir, limited, jobs_started = tokenized
    assert limited.returncode != 0
    assert re.search(r"hidden_states.max_disk_gb = 1e-06: the hidden states will take ~0.00 GB: [\d,]+ tokens "
                     r"x 2,056 bytes/token \(4 layers x 128 x float32", output(limited)), output(limited)[-4000:]
    assert "hidden_states/disk_estimate" in jobs_started
    assert not any(j.startswith("hidden_states/shard") for j in jobs_started)


def test_disk_estimate_counts_every_token(tokenized):
    workdir, _, _ = tokenized
    summary = json.loads((workdir / "results/tokenized/summary.json").read_text())
    est = json.loads((workdir / "results/hidden_states/disk_estimate.json").read_text())
    assert (est["tokens"], est["rows"]) == (summary["total_tokens"], summary["rows"])
    assert est["bytes_per_token"] == 4 * 128 * 4 + 8 and est["dtype"] == "float32"
    assert "hidden states will take" in (workdir / "logs/hidden_states/disk_estimate.log").read_text()


def test_dry_run_prints_the_estimate_and_holds_a_new_limit(tokenized, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(tokenized[0], workdir, symlinks=True)
    result = snakemake(workdir, "-n", "results/hidden_states/all")
    assert re.search(r"draftline:   hidden-state shards  ~[\d.]+ GB: [\d,]+ tokens x 2,056 bytes/token", output(result))
    # The limit is not a param (a new one re-extracts nothing); a lower one still stops the run.
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["hidden_states"]["max_disk_gb"] = 1e-6
    write_config(workdir, config)
    result = snakemake(workdir, "-n", "results/hidden_states/all", check=False)
    assert result.returncode != 0 and "hidden_states.max_disk_gb = 1e-06" in output(result)
    config["hidden_states"]["max_disk_gb"] = 10
    write_config(workdir, config)
    assert planned_jobs(workdir, "results/hidden_states/all") == {"hidden_states_shard": 2, "hidden_states_view": 1}


def test_more_shards_than_tokenized_rows_stops_before_extraction(tokenized, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(tokenized[0], workdir, symlinks=True)
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["hidden_states"]["shards"] = 20  # prompts.max_samples is null: unknown at parse time
    write_config(workdir, config)
    result = snakemake(workdir, "--cores", "1", "results/hidden_states/all", check=False)
    assert result.returncode != 0
    assert re.search(r"hidden_states.shards = 20 but the tokenized dataset .* has only \d+ conversations", output(result))
    assert not list((workdir / "results/hidden_states").glob("shard_*"))


# --- artifacts: a corrupted hidden-state file re-extracts only its shard -------------------------


def test_corrupted_hidden_state_file_reruns_only_its_shard(tokenized, tmp_path):
    """Published shards (written here as extraction would, without an engine), one file
    corrupted: the check before training names it and removes its shard; the plan redoes that one."""
    from datasets import load_from_disk

    workdir = tmp_path / "run"
    shutil.copytree(tokenized[0], workdir, symlinks=True)
    dataset = workdir / "results/tokenized/dataset"
    ids = load_from_disk(str(dataset)).with_format(None)["input_ids"]
    root = workdir / "results/hidden_states"
    for k in range(2):
        rows = hsf.shard_rows(len(ids), k, 2)
        (root / f"shard_{k}").mkdir()
        for r in rows:
            save_file({"hidden_states": torch.randn(len(ids[r]), 4, 128), "token_ids": torch.tensor(ids[r])},
                      str(root / f"shard_{k}" / hsf.file_name(r)))
        (root / f"shard_{k}" / hsf.MANIFEST).write_text(json.dumps({
            "row_start": rows.start, "row_stop": rows.stop, "dataset_rows": len(ids),
            "dataset_fingerprint": "fp", "layer_ids": {"extracted": [2, 4, 5, 8]}, "dtype": "float32"}))
    hs.build_training_view([root / "shard_0", root / "shard_1"], root / "all")
    snakemake(workdir, "--touch", "--cores", "1", "results/hidden_states/all")
    assert planned_jobs(workdir, "results/hidden_states/all") == {}
    assert validate_hidden_states(dataset, root / "all", 4, 128, dtype="float32") == sum(map(len, ids))

    row = hsf.shard_rows(len(ids), 1, 2).start
    bad = torch.randn(len(ids[row]), 4, 128)
    bad[0, 0, 0] = float("nan")
    save_file({"hidden_states": bad, "token_ids": torch.tensor(ids[row])}, str(root / "shard_1" / hsf.file_name(row)))
    with pytest.raises(hsf.HiddenStateFileError, match=rf"hs_{row}.safetensors \(dataset row {row}\).*non-finite.*removed .*shard_1"):
        validate_hidden_states(dataset, root / "all", 4, 128, remove_bad_shards=True)
    assert planned_jobs(workdir, "results/hidden_states/all") == {"hidden_states_shard": 1, "hidden_states_view": 1}
    assert (root / "shard_0").exists()


# --- remote code -----------------------------------------------------------------------------


def test_config_loaders_never_run_model_code_by_default(tiny_model, tmp_path):
    """A folder whose config points at its own Python: every loader the stages use refuses it."""
    from draftline.artifacts.target import dims as target_dims
    from draftline.artifacts.target import vocab_size as target_vocab_size
    from draftline.stages.layer_ids import resolve_layer_ids

    folder = tmp_path / "remote"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="draftline_custom", auto_map={"AutoConfig": "custom.CustomConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "remote-code-ran"
    (folder / "custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    for load in (lambda: resolve_layer_ids("auto", str(folder)), lambda: target_dims(folder),
                 lambda: target_vocab_size(folder)):
        with pytest.raises(Exception, match="trust_remote_code"):
            load()
    assert not marker.exists()


LOADERS = {"from_pretrained", "LLM", "get_verifier_config", "resolve_target_layer_ids",
           "get_target_vocab_size", "snapshot_download"}


def _python_files():
    # the step code: src/draftline's modules, a package's modules (train/, preflight/) too, and the scripts
    src = REPO / "src" / "draftline"
    return sorted([*src.glob("*.py"), *src.glob("train/*.py"), *src.glob("preflight/*.py")]) + sorted((REPO / "scripts").glob("*.py"))


def test_remote_code_only_from_the_config():
    """No loader is called with trust_remote_code=True, every function's default is False, and
    every rule that passes it takes config["target"]["trust_remote_code"]."""
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                for kw in node.keywords:
                    if kw.arg == "trust_remote_code" and isinstance(kw.value, ast.Constant) and kw.value.value:
                        offenders.append(f"{path.name}:{node.lineno} {name}(trust_remote_code=True)")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.args + node.args.kwonlyargs
                defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults + node.args.kw_defaults
                for arg, default in zip(args, defaults):
                    # required (no default) is fine: every caller passes the config's value
                    if arg.arg == "trust_remote_code" and default is not None and not (
                        isinstance(default, ast.Constant) and default.value is False
                    ):
                        offenders.append(f"{path.name}:{node.lineno} {node.name}: trust_remote_code default is not False")
    for rule_file in sorted((REPO / "rules").glob("*.smk")):
        for n, line in enumerate(rule_file.read_text().splitlines(), 1):
            if re.match(r"\s*trust_remote_code\s*=", line) and 'config["target"]["trust_remote_code"]' not in line:
                offenders.append(f"{rule_file.name}:{n} {line.strip()}")
    assert offenders == []
    schema = yaml.safe_load((REPO / "config/schema/config.schema.yaml").read_text())
    assert schema["properties"]["target"]["properties"]["trust_remote_code"]["default"] is False


# --- atomic publishing ---------------------------------------------------------------------------

# Writes into a folder that is not a published output (or not yet): the target folder being
# assembled inside atomic_dir, the Trainer's run folder, a shard's staging folder, the
# Trainer's metrics log (appended to while it trains).
NOT_FINAL = {
    ("folder.py", "write_chat_template"), ("folder.py", "clean_tokenizer_config"),
    ("folder.py", "write_provenance"), ("checkpoints.py", "open_run"), ("hidden_states.py", "extract_shard"),
    ("entry.py", "emit"),
    # the preflight's training step: its scratch folder (removed after the step) and each rank's record in it
    ("training.py", "step_inputs"), ("training_entry.py", "main"),
    # the per-user cache of target hashes (no output; save() writes a temporary file, then renames),
    # saved by the plan once it identified the target
    ("target_hash_cache.py", "hash_ahead"), ("plan.py", "_resolve_target"),
}
WRITES = {"write_text", "write_bytes", "save", "save_file", "save_to_disk", "save_pretrained", "dump"}


def test_outputs_are_written_under_a_temporary_name():
    """Every write in the step code happens inside atomic_file/atomic_dir, into a staging
    folder, or (listed above) into a folder that is not a final output."""
    offenders = []

    def visit(node, path, func, atomic):
        if isinstance(node, ast.With) and any(
            isinstance(i.context_expr, ast.Call) and getattr(i.context_expr.func, "id", "").startswith("atomic_")
            for i in node.items
        ):
            atomic = True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        if isinstance(node, ast.Call) and not atomic and (path.name, func) not in NOT_FINAL:
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            source = ast.unparse(node)
            mode_w = name == "open" and any(isinstance(a, ast.Constant) and str(a.value)[:1] in "wa" for a in node.args[1:2])
            if (name in WRITES and name != "dump" or mode_w) and not re.search(r"staging|tmp|buf", source):
                offenders.append(f"{path.name}:{node.lineno} in {func}: {source[:80]}")
        for child in ast.iter_child_nodes(node):
            visit(child, path, func, atomic)

    for path in _python_files():
        if path.name == "atomic.py":
            continue
        visit(ast.parse(path.read_text()), path, "<module>", False)
    assert offenders == []
