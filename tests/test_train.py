"""Training with speculators' real Trainer on the tiny target (CPU), resume, final/, vLLM load.

Inputs are built here the way the earlier stages build them: an arrow dataset
(input_ids, loss_mask, seq_len), speculators' token_freq.pt, and hidden-state files
from a transformers forward pass (vLLM layer id i = output of decoder layer i).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
AUX = [2, 4, 5]
DRAFT_VOCAB = 64
TOPICS = [
    "the capital of France",
    "how a hash table works",
    "speculative decoding",
    "the sea",
    "numbers and math",
    "a draft model",
    "unicode text",
    "python functions",
]


def conversations(n: int) -> list[list[dict]]:
    rows = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        rows.append(
            [
                {"role": "user", "content": f"Tell me about {topic}. ({i})"},
                {"role": "assistant", "content": f"Here is something about {topic}: " + "the sea is wide. " * (1 + i % 4)},
            ]
        )
    return rows


def build_dataset(target: Path, out: Path, rows: int = 16):
    """speculators' arrow layout; loss on the assistant turn only."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    ids, masks = [], []
    for conv in conversations(rows):
        prompt = tok.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(conv, tokenize=False)
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        full_ids = tok(full, add_special_tokens=False)["input_ids"]
        ids.append(full_ids)
        masks.append([0] * n_prompt + [1] * (len(full_ids) - n_prompt))
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": masks, "seq_len": [len(x) for x in ids]})
    ds.set_format("torch")
    ds.save_to_disk(str(out))
    return ds


def write_hidden_states(target: Path, dataset, out: Path, aux: list[int]) -> None:
    """hs_<row>.safetensors: hidden_states [seq, len(aux)+1, hidden] (aux + last layer), token_ids."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    layers = model.model.layers
    ids_wanted = [*aux, len(layers)]
    captured: dict[int, torch.Tensor] = {}
    hooks = [
        layers[i - 1].register_forward_hook(
            lambda _m, _in, output, i=i: captured.__setitem__(i, output[0] if isinstance(output, tuple) else output)
        )
        for i in ids_wanted
    ]
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for row in range(len(dataset)):
            input_ids = dataset[row]["input_ids"]
            model(input_ids=input_ids[None])
            states = torch.stack([captured[i][0] for i in ids_wanted], dim=1).contiguous()
            save_file({"hidden_states": states, "token_ids": input_ids.clone()}, str(out / f"hs_{row}.safetensors"))
    for hook in hooks:
        hook.remove()


@pytest.fixture(scope="module")
def train_inputs(tiny_model, tmp_path_factory):
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    from draftline.stages.speculator_config import write_speculator_config
    from draftline.stages.train import TrainInputs
    from draftline.stages.vocab import write_vocab

    root = tmp_path_factory.mktemp("train-inputs")
    ds = build_dataset(tiny_model, root / "tokenized" / "dataset")
    save_token_frequency_distribution(ds, root / "tokenized" / "token_freq.pt")
    write_hidden_states(tiny_model, ds, root / "hidden_states" / "all", AUX)
    (root / "layer_ids.json").write_text(json.dumps({"aux": AUX, "extracted": [*AUX, 8], "num_hidden_layers": 8}))
    vocab = root / "vocab"
    write_vocab(root / "tokenized" / "token_freq.pt", tiny_model, DRAFT_VOCAB,
                vocab / "d2t.npy", vocab / "t2d.npy", vocab / "summary.json")
    write_speculator_config(root / "config", tiny_model, root / "layer_ids.json", DRAFT_VOCAB)
    return TrainInputs(
        config_dir=root / "config",
        dataset=root / "tokenized" / "dataset",
        hidden_states=root / "hidden_states" / "all",
        d2t=vocab / "d2t.npy",
        t2d=vocab / "t2d.npy",
        layer_ids=root / "layer_ids.json",
        target=str(tiny_model),
    )


SETTINGS = dict(epochs=2, total_seq_len=256, train_fraction=0.75)


@pytest.fixture(scope="module")
def trained(train_inputs, tmp_path_factory):
    from draftline.stages.train import TrainJob, TrainSettings, train

    root = tmp_path_factory.mktemp("train-out")
    final = train(train_inputs, TrainSettings(**SETTINGS), TrainJob(root / "runs", root / "final", threads=1))
    return root, final


@pytest.mark.dag
def test_training_publishes_best_epoch_with_expected_tensors(train_inputs, trained):
    import numpy as np
    from safetensors import safe_open

    from draftline.artifacts import metrics

    _root, final = trained
    assert sorted(p.name for p in final.iterdir()) == [
        "config.json", "draftline_provenance.json", "metrics.jsonl", "model.safetensors",
        "run.yaml", "train_command.txt", "val_metrics.json",
    ]
    provenance = json.loads((final / "draftline_provenance.json").read_text())
    losses = {int(k): v for k, v in provenance["val_loss_per_epoch"].items()}
    assert sorted(losses) == [1, 2]  # epochs counted from 1, as in the logs and the report
    assert provenance["chosen_epoch"] == min(losses, key=losses.get)
    assert provenance["chosen_epoch_folder"] == str(provenance["chosen_epoch"] - 1)  # speculators' folder
    assert provenance["optimizer"] == "adamw" and provenance["device"] == "cpu"
    assert provenance["throughput"]["tokens_per_s"] > 0
    assert "--from-pretrained" in (final / "train_command.txt").read_text()
    assert provenance["algorithm"] == "eagle3"
    # offline: every file is checked first, so nothing is skipped (counted all the same)
    assert provenance["skipped_samples"] == {"total": 0, "training": 0, "validation": 0, "per_epoch": {}, "allowed": 0}
    # what speculators' sampler cut or left out: one process leaves nothing out of an epoch
    from datasets import load_from_disk

    lengths = [int(n) for n in load_from_disk(str(train_inputs.dataset)).with_format(None)["seq_len"]]
    dropped = provenance["dropped_samples"]
    assert dropped["world_size"] == 1 and dropped["training"]["left_over_per_epoch"] == [0, 0]
    assert dropped["training"]["samples"] + dropped["validation"]["samples"] == len(lengths)
    assert dropped["training"]["truncated"] + dropped["validation"]["truncated"] == sum(n > 256 for n in lengths)
    # the run's records travel with the draft (the report's loss plot reads them there)
    assert sorted(metrics.val_losses(final / "metrics.jsonl")) == [0, 1]

    with safe_open(str(final / "model.safetensors"), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    hidden = 128
    assert tensors["fc.weight"].shape == (hidden, len(AUX) * hidden)
    assert tensors["lm_head.weight"].shape == (DRAFT_VOCAB, hidden)
    assert tensors["d2t"].shape == (DRAFT_VOCAB,) and tensors["t2d"].shape == (512,)
    assert any(k.startswith("layers.0.") for k in tensors)
    assert not any(k.startswith("layers.1.") for k in tensors)  # draft.num_layers = 1
    # The maps trained with are the vocab stage's, not ones speculators rebuilt.
    np.testing.assert_array_equal(tensors["d2t"].numpy(), np.load(train_inputs.d2t))
    np.testing.assert_array_equal(tensors["t2d"].numpy(), np.load(train_inputs.t2d))


@pytest.mark.dag
def test_final_checkpoint_loads_in_speculators(trained):
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(str(trained[1]))
    assert model.config.eagle_aux_hidden_state_layer_ids == AUX
    assert model.config.draft_vocab_size == DRAFT_VOCAB


@pytest.mark.dag
def test_retry_discards_cut_short_epoch_and_resumes(train_inputs, trained, caplog):
    """A job killed while saving epoch 2 resumes from epoch 1's checkpoint, not from scratch."""
    import logging
    import shutil

    from draftline.stages.train import TrainJob, TrainSettings, train

    root, final = trained
    (run_dir,) = (root / "runs").iterdir()
    (run_dir / "1" / "training_state.json").unlink()  # written last: as if killed mid-save
    shutil.rmtree(final)
    with caplog.at_level(logging.INFO):
        train(train_inputs, TrainSettings(**SETTINGS), TrainJob(root / "runs", final, threads=1))
    text = caplog.text
    assert f"discarding incomplete checkpoint {run_dir / '1'}" in text
    assert "Resuming training on epoch 1." in text  # speculators counts epochs from 0
    assert "[draftline] epoch 2 done" in text and "(epoch 1/2)" not in text  # epoch 1 not trained again
    assert "[draftline] step " in text  # progress: step N/M (epoch e/E)
    assert [p.name for p in (root / "runs").iterdir()] == [run_dir.name]  # same run, no new one
    assert (final / "model.safetensors").exists()


def test_run_key_follows_settings_and_inputs():
    from draftline.stages.train import TrainSettings, run_key

    inputs = {"dataset": "a", "hidden_states": "b"}
    base = run_key(TrainSettings(), "adamw", 1, inputs)
    assert run_key(TrainSettings(), "adamw", 1, dict(inputs)) == base
    assert run_key(TrainSettings(lr=3e-4), "adamw", 1, inputs) != base
    assert run_key(TrainSettings(), "muon", 1, inputs) != base
    assert run_key(TrainSettings(), "adamw", 2, inputs) != base
    assert run_key(TrainSettings(), "adamw", 1, {**inputs, "hidden_states": "c"}) != base


def _facts(rows: int, dtype: str = "float32"):
    """What check_inputs finds for an eagle3 draft reading AUX with a 64-token draft vocabulary."""
    from draftline.stages.train import InputFacts

    return InputFacts(rows=rows, aux=AUX, draft_vocab_size=64, hidden_states_dtype=dtype)


@pytest.mark.parametrize("rows", [2, 3, 7, 10, 240, 1000, 99_999])
def test_train_fraction_one_keeps_a_single_validation_row(rows, tmp_path):
    """speculators 0.9.0 needs a validation split: 1.0 leaves it one row (ignored)."""
    from draftline.stages.train import TrainerOptions, TrainInputs, TrainSettings, speculators_args

    inputs = TrainInputs(*(tmp_path,) * 6, target="t")
    args = speculators_args(inputs, TrainSettings(train_fraction=1.0), _facts(rows), TrainerOptions(), tmp_path)
    ratio = float(args[args.index("--train-data-ratio") + 1])
    assert 0 < ratio < 1 and int(rows * ratio) == rows - 1


def test_too_few_rows_for_a_split_is_a_clear_error(tmp_path):
    from draftline.stages.train import TrainerOptions, TrainInputs, TrainSettings, speculators_args

    inputs = TrainInputs(*(tmp_path,) * 6, target="t")
    with pytest.raises(ValueError, match="train.train_fraction"):
        speculators_args(inputs, TrainSettings(train_fraction=0.9), _facts(1), TrainerOptions(), tmp_path)


def test_missing_hidden_states_are_reported_before_training(train_inputs, tmp_path):
    from dataclasses import replace

    from draftline.stages.train import check_inputs

    view = tmp_path / "all"
    view.mkdir()
    for f in train_inputs.hidden_states.iterdir():
        if f.name != "hs_3.safetensors":
            (view / f.name).symlink_to(f)
    with pytest.raises(ValueError, match=r"1 of 16 dataset rows \(e.g. hs_3.safetensors\)"):
        check_inputs(replace(train_inputs, hidden_states=view))


def test_optimizer_auto_is_adamw_on_cpu_and_muon_on_cuda():
    from draftline.planning.rule_params import resolve_optimizer

    assert resolve_optimizer("auto", cuda=False) == "adamw"
    assert resolve_optimizer("auto", cuda=True) == "muon"
    assert resolve_optimizer("muon", cuda=False) == "muon"


@pytest.mark.dag
def test_trained_draft_runs_as_eagle3_in_vllm(tiny_model, trained, tmp_path):
    """vLLM CPU loads final/ as an eagle3 draft; speculation does not change greedy outputs."""
    from workflow import speculative_decoding_in_vllm

    result = speculative_decoding_in_vllm(tiny_model, trained[1], tmp_path)
    assert result["metrics"]["vllm:spec_decode_num_drafts"] > 0
    assert result["metrics"]["vllm:spec_decode_num_draft_tokens"] > 0
    assert result["spec"] == result["plain"]


@pytest.mark.dag
def test_changing_a_setting_starts_a_new_run_and_removes_the_old_one(train_inputs, trained, caplog):
    """A changed learning rate trains a new run folder; once it publishes, the earlier run's
    folder (every epoch with optimizer state) is removed, unless keep_old_runs is set."""
    import logging

    from draftline.stages.train import TrainJob, TrainSettings, train

    root, final = trained
    (old_run,) = (root / "runs").iterdir()
    with caplog.at_level(logging.INFO):
        train(train_inputs, TrainSettings(**{**SETTINGS, "epochs": 1, "lr": 3e-4, "keep_old_runs": True}),
              TrainJob(root / "runs", final, threads=1))
    runs = sorted(p.name for p in (root / "runs").iterdir())
    assert old_run.name in runs and len(runs) == 2
    provenance = json.loads((final / "draftline_provenance.json").read_text())
    assert provenance["settings"]["lr"] == 3e-4 and provenance["run_key"] != old_run.name
    assert (provenance["num_workers"], provenance["fsdp"]) == (0, False)  # as resolved on the CPU

    # The same settings again without keep_old_runs: resumes the new run (nothing to train),
    # republishes, and removes the first run's folder.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        train(train_inputs, TrainSettings(**{**SETTINGS, "epochs": 1, "lr": 3e-4}),
              TrainJob(root / "runs", final, threads=1))
    assert [p.name for p in (root / "runs").iterdir()] == [provenance["run_key"]]
    assert f"removed the earlier run {old_run}" in caplog.text


def test_loader_workers_and_fsdp_reach_speculators_without_changing_the_run_key(tmp_path):
    from draftline.planning.rule_params import resolve_num_workers
    from draftline.stages.train import TrainerOptions, TrainInputs, TrainSettings, run_key, speculators_args

    assert resolve_num_workers("auto", cuda=False) == 0
    assert resolve_num_workers("auto", cuda=True) > 0
    assert resolve_num_workers(6, cuda=False) == 6
    inputs = TrainInputs(*(tmp_path,) * 6, target="t")
    args = speculators_args(inputs, TrainSettings(), _facts(100, "bfloat16"),
                            TrainerOptions(optimizer="muon", num_workers=4, fsdp=True), tmp_path)
    assert args[args.index("--num-workers") + 1] == "4" and "--fsdp-shard" in args
    assert "--fsdp-shard" not in speculators_args(inputs, TrainSettings(), _facts(100), TrainerOptions(), tmp_path)
    fingerprints = {"dataset": "a"}
    base = run_key(TrainSettings(), "adamw", 1, fingerprints)
    assert run_key(TrainSettings(num_workers=8, keep_old_runs=True), "adamw", 1, fingerprints) == base
    assert run_key(TrainSettings(fsdp=True), "adamw", 1, fingerprints) != base


def test_trust_remote_code_reaches_speculators_own_parser(tmp_path):
    """target.trust_remote_code must reach the Trainer (a target that needs its own code
    fails late otherwise): the flag is passed, and speculators' own CLI parser reads it."""
    from speculators.train.config.resolution import build_parser

    from draftline.stages.train import TrainerOptions, TrainInputs, TrainSettings, speculators_args

    inputs = TrainInputs(*(tmp_path,) * 6, target="t")
    allowed = speculators_args(inputs, TrainSettings(), _facts(100), TrainerOptions(trust_remote_code=True), tmp_path)
    refused = speculators_args(inputs, TrainSettings(), _facts(100), TrainerOptions(), tmp_path)
    assert build_parser().parse_args(allowed).trust_remote_code is True
    assert getattr(build_parser().parse_args(refused), "trust_remote_code", False) is False


def _checkpoint(folder, local_step: int, state_last: bool = True):

    folder.mkdir(parents=True)
    names = ["config.json", "model.safetensors", "optimizer_state_dict.pt"]
    for name in names:
        (folder / name).write_text("x")
    (folder / "training_state.json").write_text(json.dumps({"epoch": int(folder.name), "local_step": local_step}))
    if not state_last:  # weights rewritten after the state: a later save cut short
        later = (folder / "training_state.json").stat().st_mtime_ns + 10**9
        os.utime(folder / "model.safetensors", ns=(later, later))


def test_step_checkpoints_resume_mid_epoch_and_are_never_published(tmp_path):
    """speculators' training_state.json tells an epoch's end (local_step 0) from a step checkpoint;
    only the former counts as a finished epoch, and a cut-short save is discarded."""
    from draftline.stages.train import INTERRUPTED, choose_epoch, describe_start, discard_incomplete_epochs, finished_epochs

    run = tmp_path / "run"
    assert describe_start(run, 3) == "fresh start"
    _checkpoint(run / "0", 0)
    assert describe_start(run, 3) == "resuming after epoch 1 of 3"
    _checkpoint(run / "1", 5)
    assert describe_start(run, 3) == "resuming in epoch 2 of 3 after its step 5 (a step checkpoint)"
    assert list(finished_epochs(run)) == [0]
    with pytest.raises(RuntimeError, match="end of the last epoch"):
        choose_epoch(run, 2, False, {})  # epoch 2 only has a step checkpoint: nothing to publish
    (run / INTERRUPTED).mkdir()
    with pytest.raises(RuntimeError, match="interrupted"):
        choose_epoch(run, 1, False, {})
    _checkpoint(run / "2", 3, state_last=False)
    discard_incomplete_epochs(run)
    assert sorted(p.name for p in run.iterdir()) == ["0", "1"]  # the cut-short save and interrupted/ gone


def test_progress_counts_steps_from_one_with_the_time_left():
    from draftline.stages.train.entry import MetricsRecorder

    recorder = MetricsRecorder(None)
    assert recorder.where(0, 100.0) == "step 1"  # before the Trainer tells the step counts
    recorder.steps_per_epoch, recorder.epochs = 10, 3
    recorder.first_step = None
    assert recorder.where(12, 100.0) == "step 13/30 (epoch 2/3)"  # a resumed run starts at its step
    assert recorder.where(14, 110.0) == "step 15/30 (epoch 2/3), about 0:01:15 left"  # 5 s a step, 15 to go


def test_the_published_run_records_name_the_verifier_and_rerun_from_any_checkout(tmp_path):
    """final/'s copies of speculators' run.yaml and train_command.txt as speculators writes them
    (sys.argv with the checkout's path to the entry module, the verifier's local path): renamed,
    the rest kept, the comment lines first."""
    import shlex

    import yaml

    from draftline.stages.train import name_verifier_in_run_records

    local = tmp_path / "models" / "tiny model"
    entry = tmp_path / "checkout/src/draftline/stages/train/entry.py"
    argv = [str(entry), "--verifier-name-or-path", str(local), "--data-path", "results/tokenized/dataset"]
    (tmp_path / "train_command.txt").write_text(f"# Timestamp: now\n# speculators: 0.9.0\n{shlex.join(argv)}\n")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"train": {"verifier": {"verifier_name_or_path": str(local)},
                                                                 "epochs": 2}}))
    name_verifier_in_run_records(tmp_path, "acme/Target-8B", local)

    lines = (tmp_path / "train_command.txt").read_text().splitlines()
    assert lines[:2] == ["# Timestamp: now", "# speculators: 0.9.0"] and lines[2].startswith("# draftline: ")
    assert shlex.split(lines[3]) == ["python", "-m", "draftline.stages.train.entry", "--verifier-name-or-path",
                                     "acme/Target-8B", "--data-path", "results/tokenized/dataset"]
    record = yaml.safe_load((tmp_path / "run.yaml").read_text())
    assert record == {"train": {"verifier": {"verifier_name_or_path": "acme/Target-8B"}, "epochs": 2}}
    assert str(tmp_path) not in (tmp_path / "train_command.txt").read_text() + (tmp_path / "run.yaml").read_text()


def test_the_views_fidelity_is_read_before_training_and_a_broken_manifest_stops_saying_which(tmp_path, caplog):
    import logging

    caplog.set_level(logging.WARNING)
    from draftline.stages.train.publish import view_fidelity

    view = tmp_path / "all"
    view.mkdir()
    assert view_fidelity(view) is None  # a folder of files made elsewhere: unchecked, and said so
    assert "has no manifest.json (a folder not built by draftline's hidden_states_view step)" in caplog.text
    (view / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"all/manifest.json: not valid JSON .* delete .* and rerun"):
        view_fidelity(view)
    (view / "manifest.json").write_text(json.dumps({"rows": 3}))  # a view from before the check
    assert view_fidelity(view) is None
    assert "holds no hidden-state fidelity record" in caplog.text
    record = {"total": {"top1_assistant": 0.9}, "shards": {}}
    (view / "manifest.json").write_text(json.dumps({"rows": 3, "fidelity": record}))
    assert view_fidelity(view) == record


def test_the_samples_speculators_sampler_cuts_or_leaves_out_are_counted(tmp_path):
    """Rows of at least total_seq_len tokens pack one per rank per batch, so with 3 processes the
    sampler must leave out 8 % 3 = 2 training rows each epoch, and both validation rows (fewer than
    ranks); one process leaves out none. Rows built longer than total_seq_len are the cut ones."""
    from datasets import Dataset

    from draftline.stages.train.sampling import describe, dropped_count, dropped_samples

    total = 64
    lengths = [64, 80, 64, 100, 64, 64, 70, 64, 64, 90]  # 8 training rows (ratio 0.8), 2 validation
    Dataset.from_dict({"input_ids": [[1] * n for n in lengths], "loss_mask": [[1] * n for n in lengths],
                       "seq_len": lengths}).save_to_disk(str(tmp_path / "ds"))
    three = dropped_samples(tmp_path / "ds", total, 0.8, world_size=3, epochs=2, seed=0)
    assert three["training"] == {"samples": 8, "truncated": 3, "truncated_tokens": 16 + 36 + 6,
                                 "left_over_per_epoch": [2, 2]}
    assert three["validation"] == {"samples": 2, "truncated": 1, "truncated_tokens": 26,
                                   "left_over_per_epoch": [2, 2]}
    one = dropped_samples(tmp_path / "ds", total, 0.8, world_size=1, epochs=2, seed=0)
    assert one["training"]["left_over_per_epoch"] == [0, 0] and one["validation"]["left_over_per_epoch"] == [0, 0]
    assert dropped_count(one) == 4 and dropped_count(three) == 4 + 8
    assert "3 of 8 in training (58 tokens never trained on)" in describe(three)
    # a batch that holds every row whole: nothing cut, nothing left over with one process
    nothing = dropped_samples(tmp_path / "ds", 128, 0.8, world_size=1, epochs=1, seed=0)
    assert dropped_count(nothing) == 0


def test_the_run_keys_target_is_the_plans_identity_or_the_folders_content(tmp_path, tiny_model):
    """Given the plan's identity (the rule's `target` param), nothing of the target is read; without
    it, the folder's content through the hash cache (a rewrite in place is a new run key)."""
    import shutil

    from draftline.stages.train import TrainInputs, input_fingerprints

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    base = dict(config_dir=tmp_path, dataset=tmp_path / "none", hidden_states=None, d2t=tmp_path / "none",
                t2d=tmp_path / "none", layer_ids=tmp_path / "none", target=str(model))
    server = {"any": "server"}
    planned = input_fingerprints(TrainInputs(**base, target_identity={"kind": "local", "sha256": "abc"}), server)
    other = input_fingerprints(TrainInputs(**base, target_identity={"kind": "local", "sha256": "def"}), server)
    assert planned["target"] != other["target"]
    by_content = input_fingerprints(TrainInputs(**base), server)["target"]
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    assert input_fingerprints(TrainInputs(**base), server)["target"] != by_content


def test_every_place_draftline_reaches_inside_speculators_is_named_and_still_there():
    """speculators_patches names each attribute the Trainer's entry point replaces and each private
    name relied on; after an upgrade, a renamed one fails here, not in a training job. An
    attribute not in the table is refused."""
    import ast

    from draftline.stages.train import speculators_patches as patches

    for patch in patches.PATCHES + patches.PRIVATE:
        assert patches.current(patch.target) is not None, patch.target
        module, _, function = patch.by.rpartition(".")
        assert function in {n.name for n in ast.walk(ast.parse((REPO / "src/draftline" / f"{module.replace('.', '/')}.py")
                                                             .read_text())) if isinstance(n, ast.FunctionDef)}, patch.by
    # every replace() call in the source names a target of the table
    named = set()
    for path in (REPO / "src/draftline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "replace" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                named.add(node.args[0].value)
    assert named == {p.target for p in patches.PATCHES}
    with pytest.raises(KeyError, match="name it there, with why"):
        patches.replace("speculators.train.cli:main", None)
