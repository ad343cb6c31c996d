"""Resume after a crash: SIGKILL a running workflow, unlock, rerun; finished work is kept.

Each test copies the finished tiny-model run (conftest.tiny_run) and reruns one expensive
step there (a vLLM engine or speculators' Trainer), so both are marked slow.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from workflow import AFTER_TRAIN, REPO, SNAKEMAKE, copy_run, planned_jobs, snakemake, write_config

from draftline.stages.train.checkpoints import local_step

# Imported by every Python process of a test run (it is on PYTHONPATH): makes each move of a
# validated hidden-state file into the staging folder slow, so a kill lands mid-shard.
SLOW_STAGING = '''
import os, time
_delay = float(os.environ.get("DRAFTLINE_TEST_SLOW_STAGING", "0"))
if _delay:
    _replace = os.replace
    def replace(src, dst, *args, **kwargs):
        _replace(src, dst, *args, **kwargs)
        if "/.staging/" in os.fspath(dst) and os.fspath(dst).endswith(".safetensors"):
            time.sleep(_delay)
    os.replace = replace
'''


# Imported by every Python process of a test run (on PYTHONPATH): makes each finished chunk of
# regeneration slow to stage, so a kill lands mid-shard, and records every conversation turn
# vLLM answered (first user message, turn) at LLM.chat, the engine's own entry point.
REGENERATION_HOOKS = '''
import importlib.machinery, json, os, sys, time
_delay = float(os.environ.get("DRAFTLINE_TEST_SLOW_STAGING", "0"))
if _delay:
    _replace = os.replace
    def replace(src, dst, *args, **kwargs):
        _replace(src, dst, *args, **kwargs)
        if "/.staging/" in os.fspath(dst) and os.fspath(dst).endswith(".json"):
            time.sleep(_delay)
    os.replace = replace
_requests = os.environ.get("DRAFTLINE_TEST_REQUESTS")

class _RecordChat:
    def find_spec(self, name, path=None, target=None):
        if name != "vllm.entrypoints.llm":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module
        def patched(module):
            exec_module(module)
            chat = module.LLM.chat
            def recorded(self, messages, *args, **kwargs):
                outputs = chat(self, messages, *args, **kwargs)
                with open(_requests, "a") as f:
                    for m in messages:
                        users = [x["content"] for x in m if x["role"] == "user"]
                        f.write(json.dumps([users[0], len(users)]) + "\\n")
                return outputs
            module.LLM.chat = recorded
        spec.loader.exec_module = patched
        return spec

if _requests:
    sys.meta_path.insert(0, _RecordChat())
'''


def start(workdir: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """snakemake in its own process group, so one killpg takes it and every job it started; its
    output goes to `<workdir>.snakemake.log` beside the folder (kill_when shows it on a failure)."""
    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml"), *args]
    output = workdir.with_name(f"{workdir.name}.snakemake.log")
    with open(output, "a") as out:
        proc = subprocess.Popen(
            cmd, env=env or dict(os.environ), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    proc.output = output
    proc.workdir = workdir
    return proc


def _failure_context(proc: subprocess.Popen) -> str:
    """The tail of snakemake's output and of the job logs it names, for a failure message."""
    text = proc.output.read_text(errors="replace")
    parts = [f"--- {proc.output} (tail)\n" + "\n".join(text.splitlines()[-60:])]
    for name in sorted(set(re.findall(r"\b(logs/[^\s,]+)", text))):
        log = proc.workdir / name
        if log.is_file():
            parts.append(f"--- {log} (tail)\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    return "\n".join(parts)


def kill_when(proc: subprocess.Popen, ready, timeout: float = 900, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to snakemake and every job it started once `ready()` holds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"snakemake exited ({proc.returncode}) before the kill point\n{_failure_context(proc)}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"the kill point was not reached in time\n{_failure_context(proc)}")
        time.sleep(0.02)
    os.killpg(proc.pid, sig)
    proc.wait()


def assert_locked_then_unlock(workdir: Path, *rerun: str, sig: int = signal.SIGKILL) -> None:
    """After SIGKILL Snakemake's lock stays: the rerun refuses to start until --unlock. On
    SIGTERM Snakemake stops gracefully and may release it; unlocking is harmless either way."""
    if sig == signal.SIGKILL:
        refused = snakemake(workdir, *rerun, check=False)
        assert refused.returncode != 0 and "--unlock" in refused.stdout + refused.stderr
    snakemake(workdir, "--unlock")


@pytest.mark.slow
def test_killed_shard_reruns_only_that_shard_keeping_staged_rows(tiny_run, tmp_path):
    """A shard's extraction killed twice, once each way a job dies: SIGKILL, then, in the rerun,
    SIGTERM (what Slurm sends every process of a preempted or timed-out job before SIGKILL). Each
    rerun extracts only the rows no earlier job staged, and the shard it publishes is made of the
    staged files themselves."""
    run = copy_run(tiny_run, tmp_path / "run")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_STAGING)
    env = dict(os.environ, DRAFTLINE_TEST_SLOW_STAGING="1.0",
               PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    shard0, shard1 = run / "results/hidden_states/shard_0", run / "results/hidden_states/shard_1"
    shard0_before = (shard0 / "manifest.json").stat().st_mtime_ns
    rows = json.loads((shard1 / "manifest.json").read_text())["num_rows"]
    assert rows >= 5  # 2 rows staged before each kill, and 1 left for the last rerun

    # A first run that got as far as shard 0: what follows the shards is not there yet.
    # (Forcing one shard of a finished run instead would leave the view and the checkpoint
    # looking up to date after a kill: Snakemake does not rebuild a missing intermediate.)
    for path in ("results/hidden_states/shard_1", "results/hidden_states/all", "results/checkpoint/final"):
        shutil.rmtree(run / path)
    (run / "results/lineage.json").unlink()
    staging = run / "results/hidden_states/.staging"
    rerun = ("--cores", "1", "--rerun-incomplete", "results/hidden_states/shard_1")

    def staged_rows() -> dict[str, int]:
        # inode per staged file: the published shard hard-links them, so equal inodes mean kept
        return {p.name: p.stat().st_ino for p in staging.glob("shard_1-*/hs_*.safetensors")}

    def kill_mid_shard(proc: subprocess.Popen, sig: int, before: dict[str, int]) -> dict[str, int]:
        """`sig` once 2 rows more than `before` are staged; what the killed job leaves behind."""
        kill_when(proc, lambda: len(staged_rows()) >= len(before) + 2, sig=sig)
        staged = staged_rows()
        assert len(before) + 2 <= len(staged) < rows
        assert {name: staged.get(name) for name in before} == before, "rows an earlier job staged were not kept"
        assert not shard1.exists() and not (run / "results/hidden_states/all").exists()
        assert_locked_then_unlock(run, *rerun, sig=sig)
        # Only the killed shard and what reads the shards; shard 0 and the data before are kept.
        assert planned_jobs(run, "results/lineage.json", extra=("--rerun-incomplete",)) == {
            "hidden_states_shard": 1, "hidden_states_view": 1, "report_hidden_states_disk": 1, **AFTER_TRAIN,
        }
        return staged

    killed = kill_mid_shard(start(run, "--cores", "1", "results/lineage.json", env=env), signal.SIGKILL, {})
    staged = kill_mid_shard(start(run, *rerun, env=env), signal.SIGTERM, killed)
    snakemake(run, *rerun)
    manifest = json.loads((shard1 / "manifest.json").read_text())
    assert manifest["reused_rows"] == len(staged)
    assert manifest["extracted_rows"] == rows - len(staged)
    assert {name: (shard1 / name).stat().st_ino for name in staged} == staged
    assert (shard0 / "manifest.json").stat().st_mtime_ns == shard0_before
    assert (shard1 / "provenance.json").is_file()


@pytest.mark.slow
def test_killed_training_resumes_from_last_epoch_checkpoint(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    epochs = 3
    config["train"]["epochs"] = epochs  # a new run key: its own run folder, started fresh
    write_config(run, config)
    runs = run / "results/checkpoint/runs"
    old_runs = {p.name for p in runs.iterdir()}

    def new_epochs() -> list[Path]:
        # an epoch whose training_state.json (written last) reads whole: a kill while speculators
        # writes it leaves a checkpoint training rightly discards
        return sorted(
            (d for r in runs.iterdir() if r.name not in old_runs for d in r.iterdir()
             if d.name.isdigit() and local_step(d) is not None),
            key=lambda d: int(d.name),
        )

    proc = start(run, "--cores", "2", "results/checkpoint/final")
    kill_when(proc, lambda: len(new_epochs()) >= 1)
    done = new_epochs()
    assert 1 <= len(done) < epochs, "the kill must land between the first and the last epoch"
    kept = {d.name: (d / "model.safetensors").stat().st_mtime_ns for d in done}

    rerun = ("--cores", "2", "--rerun-incomplete", "results/checkpoint/final")
    assert_locked_then_unlock(run, *rerun)
    assert planned_jobs(run, "results/lineage.json", extra=("--rerun-incomplete",)) == AFTER_TRAIN
    snakemake(run, *rerun)
    starts = re.findall(r"resuming after epoch \d+ of \d+|fresh start", (run / "logs/train.log").read_text())
    assert starts[-1] == f"resuming after epoch {len(done)} of {epochs}"
    # the epochs finished before the kill were not trained again
    assert {n: (done[0].parent / n / "model.safetensors").stat().st_mtime_ns for n in kept} == kept
    provenance = json.loads((run / "results/checkpoint/final/draftline_provenance.json").read_text())
    assert provenance["epochs"] == epochs
    assert (run / "results/checkpoint/final/provenance.json").is_file()


@pytest.mark.slow
def test_killed_regeneration_resumes_answering_each_conversation_once(tiny_run, tmp_path):
    """SIGKILL mid-shard after a chunk is staged; the rerun answers only the conversations no
    staged chunk holds (requests counted at vLLM's LLM.chat in both runs), and the merged file
    is the uninterrupted run's (the tiny run's, answered in one chunk) byte for byte."""
    run = copy_run(tiny_run, tmp_path / "run")
    reference = (run / "results/regenerated/conversations.jsonl").read_bytes()
    shutil.rmtree(run / "results/regenerated")  # a first run that got as far as the prompts
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["regenerate"]["chunk_conversations"] = 4  # not an answer setting: the same answers
    write_config(run, config)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(REGENERATION_HOOKS)
    killed_log, rerun_log = tmp_path / "killed-requests.jsonl", tmp_path / "rerun-requests.jsonl"
    env = dict(os.environ, DRAFTLINE_TEST_SLOW_STAGING="3", DRAFTLINE_TEST_REQUESTS=str(killed_log),
               PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    target = "results/regenerated/conversations.jsonl"
    staging = run / "results/regenerated/.staging"

    proc = start(run, "--cores", "1", target, env=env)
    kill_when(proc, lambda: any(staging.glob("*/chunk_*.json")))
    chunks = [json.loads(p.read_text()) for p in staging.glob("*/chunk_*.json")]
    staged = {rid for c in chunks for rid in c["ids"]}
    prompts = [json.loads(line) for line in (run / "results/prompts/prompts.jsonl").read_text().splitlines()]
    assert len(chunks) == 1 and len(staged) == 4 < len(prompts)
    assert not (run / "results/regenerated/shard_0").exists()

    rerun = ("--cores", "1", "--rerun-incomplete", target)
    assert_locked_then_unlock(run, *rerun)
    snakemake(run, *rerun, env=dict(env, DRAFTLINE_TEST_SLOW_STAGING="0", DRAFTLINE_TEST_REQUESTS=str(rerun_log)))

    def turns(rows):
        return {(users[0], t) for r in rows for users in [[m["content"] for m in r["messages"] if m["role"] == "user"]]
                for t in range(1, len(users) + 1)}

    killed = [tuple(json.loads(line)) for line in killed_log.read_text().splitlines()]
    again = [tuple(json.loads(line)) for line in rerun_log.read_text().splitlines()]
    assert set(killed) == turns(r for r in prompts if r["id"] in staged)  # the staged chunk, answered once
    assert sorted(again) == sorted(turns(r for r in prompts if r["id"] not in staged))  # the rest, once each
    assert not set(killed) & set(again)
    summary = json.loads((run / "results/regenerated/shard_0/summary.json").read_text())
    assert (summary["reused"], summary["answered"]) == (4, len(prompts) - 4)
    assert (run / target).read_bytes() == reference
    # same answers, same settings file: nothing after regeneration reruns
    assert planned_jobs(run, "results/lineage.json") == {}


# Imported by every Python process of a test run (on PYTHONPATH): each optimizer step of
# speculators' Trainer sleeps, so a signal lands between checkpoints.
SLOW_STEPS = '''
import importlib.machinery, os, sys, time
_delay = float(os.environ.get("DRAFTLINE_TEST_SLOW_STEP", "0"))

class _SlowSteps:
    def find_spec(self, name, path=None, target=None):
        if name != "speculators.train.trainer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module
        def patched(module):
            exec_module(module)
            step = module.Trainer._schedulers_step
            def slow(self):
                time.sleep(_delay)
                return step(self)
            module.Trainer._schedulers_step = slow
        spec.loader.exec_module = patched
        return spec

if _delay:
    sys.meta_path.insert(0, _SlowSteps())
'''


@pytest.mark.slow
def test_sigterm_mid_epoch_resumes_from_the_step_checkpoint(tiny_run, tmp_path):
    """Slurm preempts or times out a job with SIGTERM to all its processes: training stops,
    publishes nothing, and the rerun resumes inside the epoch from the last step checkpoint
    (train.checkpoint_freq 0.5: one after the first of each epoch's two steps)."""
    run = copy_run(tiny_run, tmp_path / "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"].update(epochs=3, checkpoint_freq=0.5)  # a new run key: its own folder
    write_config(run, config)
    runs = run / "results/checkpoint/runs"
    old_runs = {p.name for p in runs.iterdir()}
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_STEPS)
    env = dict(os.environ, DRAFTLINE_TEST_SLOW_STEP="2.5",
               PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))

    def states() -> dict[str, dict]:
        found = {}
        for r in runs.iterdir():
            for d in (r.iterdir() if r.name not in old_runs else ()):
                if d.name.isdigit() and (d / "training_state.json").exists():
                    found[d.name] = json.loads((d / "training_state.json").read_text())
        return found

    proc = start(run, "--cores", "2", "results/checkpoint/final", env=env)
    # past the end of epoch 1 and the step checkpoint inside epoch 2; the signal must land within
    # the 2.5 s (slowed) step after it, before the epoch's end is saved
    deadline = time.monotonic() + 900
    while states().get("1", {}).get("local_step") != 1:
        assert proc.poll() is None and time.monotonic() < deadline, "no step checkpoint in epoch 2"
        time.sleep(0.05)
    # into the slowed step, past the save's last log line: speculators raises from its signal
    # handler, and an exception raised inside a logging call is swallowed by logging
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=300) != 0
    log = (run / "logs/train.log").read_text()
    assert "received SIGTERM" in log
    assert not (run / "results/checkpoint/final").exists()
    (run_dir,) = (r for r in runs.iterdir() if r.name not in old_runs)
    kept = (run_dir / "0" / "model.safetensors").stat().st_mtime_ns
    assert states()["1"]["local_step"] == 1  # the step checkpoint is still there to resume from

    snakemake(run, "--unlock")
    snakemake(run, "--cores", "2", "--rerun-incomplete", "results/checkpoint/final")
    log = (run / "logs/train.log").read_text()
    assert "resuming in epoch 2 of 3 after its step 1 (a step checkpoint)" in log
    assert "Resuming mid-epoch from epoch=1 local_step=1" in log  # speculators' own resume
    assert (run_dir / "0" / "model.safetensors").stat().st_mtime_ns == kept  # epoch 1 not trained again
    assert not (run_dir / "interrupted").exists()
    provenance = json.loads((run / "results/checkpoint/final/draftline_provenance.json").read_text())
    assert provenance["epochs"] == 3 and 1 <= provenance["chosen_epoch"] <= 3
