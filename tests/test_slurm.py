"""The tiny-model pipeline through profiles/slurm on a real single-node Slurm with two fake GPUs.

Skipped (with the reason) where Slurm cannot be installed or started. The cluster declares a
big node (32 CPUs, 256 GB, 2 GPUs) so the shipped profile's GPU-node requests schedule
unchanged; nothing enforces them here. Regeneration is off in the pipeline runs to keep them
small (one vLLM engine less per run); the GPU rules exercised are the hidden-state shards and
training, and regeneration alone with the target split over 2 GPUs. A failed job's retry and a
running job requeued by Slurm (as on preemption) are checked on the prompts job alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from slurm_cluster import SlurmCluster, Unavailable
from workflow import REPO, SNAKEMAKE, planned_jobs, write_config

# the tiny DAG for real (vLLM extraction, the Trainer), through Slurm
pytestmark = [pytest.mark.slurm, pytest.mark.dag]

PROFILE = REPO / "profiles" / "slurm"
GPU_RULES = {"regenerate_shard", "hidden_states_shard", "train", "evaluate_set", "evaluate_baseline"}
# Settings for a cluster without slurmdbd (docs/cluster.md), fast status checks.
TEST_SLURM_ARGS = (
    # the fake GPUs are no CUDA devices: plan for the CPU torch the jobs have (a Slurm executor
    # plans for cuda, a job on another device than planned stops, and a plan for CPU under
    # Slurm needs both keys)
    "--config", "device=cpu", "cpu_on_cluster=True",
    "--slurm-status-command", "squeue",
    "--slurm-init-seconds-before-status-checks", "1",
)
# The same without the --config: the plan is the Slurm executor's own (cuda).
SLURM_ARGS_AS_PLANNED = TEST_SLURM_ARGS[3:]
# With regeneration off, the answers to train on come with the prompts.
CONVERSATIONS = [
    ("What is the capital of France?", "Paris."), ("Write a haiku about rain.", "Soft rain on the roof."),
    ("Explain gravity briefly.", "Masses attract each other."), ("List three fruits.", "Apple, pear, plum."),
    ("How do I boil an egg?", "Simmer it for eight minutes."), ("What is 2 + 2?", "4."),
    ("Name a color.", "Blue."),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    slurm = SlurmCluster(tmp_path_factory.mktemp("slurm"), gpus=2, cpus=32, memory_mb=262144)
    try:
        slurm.start()
    except Unavailable as why:
        # CI must run what the README promises: there a Slurm that cannot start is a failure
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but Slurm could not be started here: {why}")
        pytest.skip(f"no real Slurm on this machine: {why}")
    yield slurm
    slurm.stop()


def make_workdir(workdir: Path, tiny_model: Path, extra_rows: list[str] = (), **changes: dict) -> Path:
    with open(workdir / "prompts.jsonl", "w") as f:
        for prompt, answer in CONVERSATIONS:
            f.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                             {"role": "assistant", "content": answer}]}) + "\n")
        for row in extra_rows:
            f.write(row + "\n")
    config = {
        "target": {"model": str(tiny_model)},
        "prompts": {"sources": ["prompts.jsonl"], "validation": 0, "test": 1},
        "regenerate": {"enabled": False},
        "tokenize": {"max_seq_len": 256},
        # the tiny random model predicts none of these hand-written answers (agreement ~0.05,
        # benchmarks/results/hidden_state_fidelity.md): only the layer checks apply
        "hidden_states": {"shards": 2, "fidelity": {"min_top1": 0}},
        "vocab": {"draft_vocab_size": 256},
        "train": {"epochs": 1, "total_seq_len": 256},
    }
    for section, values in changes.items():
        config[section].update(values)
    write_config(workdir, config)
    return workdir


def run(workdir: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(env if env is not None else os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    result = subprocess.run(
        [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
         "--configfile", str(workdir / "config.yaml"), *args],
        cwd=workdir, capture_output=True, text=True, env=env, timeout=1800,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}")
    return result


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_model):
    workdir = make_workdir(tmp_path_factory.mktemp("local-run"), tiny_model)
    run(workdir, "--cores", "2", "results/checkpoint/final")
    return workdir


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory, tiny_model, cluster, local_run):
    workdir = make_workdir(tmp_path_factory.mktemp("slurm-run"), tiny_model)
    plan = planned_jobs(workdir, "results/checkpoint/final")
    start = len(cluster.sbatch_calls())
    run(workdir, "--workflow-profile", str(PROFILE), *TEST_SLURM_ARGS, "--jobs", "4",
        "results/checkpoint/final", env=cluster.env())
    return workdir, plan, cluster.sbatch_calls()[start:]


def flag(args: list[str], name: str) -> str | None:
    """Value of `name` in an sbatch argument list (`--x v` or `--x=v`)."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def rule_of(args: list[str]) -> str:
    comment = flag(args, "--comment")  # the plugin's "rule_<name>[_wildcards_<w>]"
    return re.sub(r"_wildcards_.*$", "", comment).removeprefix("rule_")


def profile_resource(rule: str, key: str, attempt: int = 1, default: int | None = None) -> int:
    """The profile's value for a rule at `attempt` (`default`: what the rule itself declares)."""
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    value = profile["set-resources"].get(rule, {}).get(key, profile["default-resources"].get(key, default))
    return int(eval(str(value), {"attempt": attempt}))


def test_every_job_went_through_sbatch(slurm_run):
    workdir, plan, calls = slurm_run
    submitted: dict[str, int] = {}
    for args in calls:
        submitted[rule_of(args)] = submitted.get(rule_of(args), 0) + 1
    assert plan and submitted == plan


def test_resources_reached_sbatch(slurm_run):
    _, _, calls = slurm_run
    for args in calls:
        rule = rule_of(args)
        assert flag(args, "--mem") == str(profile_resource(rule, "mem_mb")), (rule, args)
        assert flag(args, "-t") == str(profile_resource(rule, "runtime")), (rule, args)
        if rule in GPU_RULES:
            assert flag(args, "--gpus") == str(profile_resource(rule, "gpu", default=1)), (rule, args)
            assert flag(args, "--cpus-per-gpu") == str(profile_resource(rule, "cpus_per_gpu")), (rule, args)
            assert flag(args, "--nodes") == "1", (rule, args)  # the rule's own: its GPUs on one node
        else:
            assert flag(args, "--gpus") is None, (rule, args)


def test_gpu_jobs_got_a_gpu_from_slurm(slurm_run):
    workdir, _, _ = slurm_run
    logs = [workdir / "logs/hidden_states/shard_0.log", workdir / "logs/hidden_states/shard_1.log",
            workdir / "logs/train.log"]
    for log in logs:
        # written by draftline.runtime.devices inside the job, from the job's own environment
        found = re.findall(r"Slurm job (\d+): CUDA_VISIBLE_DEVICES=(\S+) \(set by Slurm\)", log.read_text())
        assert len(found) == 1, log
        assert found[0][1] in {"0", "1"}, (log, found)


def test_outputs_equal_a_local_run(slurm_run, local_run):
    from datasets import load_from_disk

    slurm, _, _ = slurm_run
    for name in ("prompts/prompts.jsonl", "target/layer_ids.json", "config/config.json"):
        assert (slurm / "results" / name).read_text() == (local_run / "results" / name).read_text(), name
    a = load_from_disk(str(slurm / "results/tokenized/dataset"))
    b = load_from_disk(str(local_run / "results/tokenized/dataset"))
    assert a.to_dict() == b.to_dict()
    freq_a = torch.load(slurm / "results/tokenized/token_freq.pt")
    freq_b = torch.load(local_run / "results/tokenized/token_freq.pt")
    assert freq_a.keys() == freq_b.keys()
    assert all(torch.equal(torch.as_tensor(freq_a[k]), torch.as_tensor(freq_b[k])) for k in freq_b)
    for name in ("d2t.npy", "t2d.npy"):
        assert np.array_equal(np.load(slurm / "results/vocab" / name), np.load(local_run / "results/vocab" / name))
    view_a, view_b = slurm / "results/hidden_states/all", local_run / "results/hidden_states/all"
    files = sorted(p.name for p in view_b.glob("hs_*.safetensors"))
    assert files and sorted(p.name for p in view_a.glob("hs_*.safetensors")) == files
    for name in files:
        ta, tb = load_file(view_a / name), load_file(view_b / name)
        assert ta.keys() == tb.keys()
        for key in tb:
            assert torch.equal(ta[key], tb[key]), (name, key)
    # Training is seeded; the same data and settings give the same draft.
    wa = load_file(slurm / "results/checkpoint/final/model.safetensors")
    wb = load_file(local_run / "results/checkpoint/final/model.safetensors")
    assert wa.keys() == wb.keys()
    for key in wb:
        assert torch.allclose(wa[key], wb[key], atol=1e-6), key


def test_a_split_target_asks_sbatch_for_a_gpu_per_rank(tmp_path, tiny_model, cluster):
    """target.tensor_parallel_size 2: the regeneration job asks for 2 GPUs, gets both from Slurm
    and runs vLLM over two ranks (CPU workers here). Then the same job planned for cuda from this
    GPU-less machine stops on the GPU node for its CPU torch (check_job_environment)."""
    workdir = make_workdir(tmp_path, tiny_model, target={"tensor_parallel_size": 2},
                           regenerate={"enabled": True, "max_new_tokens": 4})
    start = len(cluster.sbatch_calls())
    run(workdir, "--workflow-profile", str(PROFILE), *TEST_SLURM_ARGS,
        "results/regenerated/conversations.jsonl", env=cluster.env())
    calls = [c for c in cluster.sbatch_calls()[start:] if rule_of(c) == "regenerate_shard"]
    assert len(calls) == 1 and flag(calls[0], "--gpus") == "2", calls
    assert flag(calls[0], "--cpus-per-gpu") == str(profile_resource("regenerate_shard", "cpus_per_gpu"))
    log = (workdir / "logs/regenerate/shard_0.log").read_text()
    assert re.search(r"Slurm job \d+: CUDA_VISIBLE_DEVICES=0,1 \(set by Slurm\)", log), log[-2000:]
    summary = json.loads((workdir / "results/regenerated/summary.json").read_text())
    assert summary["settings"]["parallel"]["tensor_parallel_size"] == 2
    assert summary["rows_out"] == len(CONVERSATIONS) - 1
    # The job saw Slurm's GPUs with a CPU torch and ran on the CPU because device: cpu says so.
    assert re.search(r"computing on the CPU with torch \S+\+cpu although this node offers GPUs 0,1 "
                     r"\(CUDA_VISIBLE_DEVICES, given by Slurm job \d+\)", log), log[-2000:]

    # The case of issue 17: planned on a machine without a GPU for the Slurm executor (cuda),
    # submitted, and the job sees GPUs but has the CPU environment ./draftline built on the
    # submitting machine. It stops before loading anything, saying how to build the GPU one.
    # (--retries 0: a retry would only stop the same way)
    result = run(workdir, "--workflow-profile", str(PROFILE), *SLURM_ARGS_AS_PLANNED, "--retries", "0",
                 "results/regenerated/conversations.jsonl", env=cluster.env(), check=False)
    assert result.returncode != 0
    log = (workdir / "logs/regenerate/shard_0.log").read_text()
    assert re.search(r"planned for CUDA \(device: cuda\) but its torch \S+\+cpu is a CPU build, on a node "
                     r"that offers GPUs 0,1 \(CUDA_VISIBLE_DEVICES, given by Slurm job \d+\)", log), log[-2000:]
    assert "DRAFTLINE_ENV=gpu ./draftline true" in log


def test_a_failed_job_is_retried_with_more_and_points_at_its_logs(tmp_path, tiny_model, cluster):
    # A malformed eighth row passes the parse-time check (the first rows only) and fails the
    # prompts job itself: both attempts fail, the second with the profile's grown resources.
    workdir = make_workdir(tmp_path, tiny_model, extra_rows=["{not json"])
    start = len(cluster.sbatch_calls())
    result = run(workdir, "--workflow-profile", str(PROFILE), *TEST_SLURM_ARGS,
                 "results/prompts/prompts.jsonl", env=cluster.env(), check=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    calls = [c for c in cluster.sbatch_calls()[start:] if rule_of(c) == "prompts"]
    assert [flag(c, "--mem") for c in calls] == [str(profile_resource("prompts", "mem_mb", a)) for a in (1, 2)]
    assert [flag(c, "-t") for c in calls] == [str(profile_resource("prompts", "runtime", a)) for a in (1, 2)]
    # The error names the rule's log and the Slurm job's own log, which holds the reason.
    assert "logs/prompts.log" in out
    slurm_logs = re.findall(r"(/\S*/\.snakemake/slurm_logs/rule_prompts/\d+\.log)", out)
    assert len(set(slurm_logs)) == 2, out[-3000:]
    for path in set(slurm_logs):
        assert "prompts.jsonl:8: malformed JSON" in Path(path).read_text()


# Imported by every Python process of a job (on PYTHONPATH, which sbatch --export=ALL passes on):
# the prompts job's script records each start with its Slurm job id and, on the first start
# only, sleeps, so a requeue lands while the job runs.
JOB_STARTS = '''
import json, os, sys, time
_starts = os.environ.get("DRAFTLINE_TEST_JOB_STARTS")
if _starts and sys.argv and sys.argv[0].endswith(".prompts.py"):
    _first = not os.path.exists(_starts)
    with open(_starts, "a") as f:
        f.write(json.dumps({"job": os.environ.get("SLURM_JOB_ID"), "time": time.time()}) + "\\n")
    if _first:
        time.sleep(float(os.environ["DRAFTLINE_TEST_FIRST_START_SLEEP"]))
'''


def test_a_requeued_job_keeps_its_id_and_uses_no_retry(tmp_path, tiny_model, cluster):
    """A preempted job that Slurm requeues (PreemptMode=REQUEUE) keeps its job id and runs its
    script again; `scontrol requeue` does the same to a running job. Snakemake keeps waiting on
    that id and the job finishes on its second run without a retry: one sbatch call, resources at
    attempt 1. The test cluster has JobRequeue=0, so only the profile's slurm-requeue (sbatch
    --requeue) makes the job requeueable."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    make_workdir(workdir, tiny_model)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(JOB_STARTS)
    starts = tmp_path / "starts.jsonl"
    first_sleep = 120  # the first run is requeued long before it would wake up
    env = cluster.env(dict(
        os.environ, DRAFTLINE_TEST_JOB_STARTS=str(starts), DRAFTLINE_TEST_FIRST_START_SLEEP=str(first_sleep),
        PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]),
    ))
    output = tmp_path / "snakemake.log"
    start = len(cluster.sbatch_calls())
    with open(output, "w") as out:
        proc = subprocess.Popen(
            [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
             "--configfile", str(workdir / "config.yaml"), "--workflow-profile", str(PROFILE),
             *TEST_SLURM_ARGS, "results/prompts/prompts.jsonl"],
            cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while not (starts.exists() and starts.read_text().endswith("\n")):
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"the job's script did not start (snakemake: {proc.returncode}):\n{output.read_text()[-4000:]}")
            time.sleep(0.2)
        job = json.loads(starts.read_text().splitlines()[0])["job"]
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True)
        assert state.stdout.strip() == "RUNNING", state
        requeue = subprocess.run(["scontrol", "requeue", job], env=env, capture_output=True, text=True)
        assert requeue.returncode == 0, requeue.stderr  # refused unless submitted with --requeue
        returncode = proc.wait(timeout=first_sleep + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = output.read_text()
    assert returncode == 0, log[-4000:]

    # The job ran twice under the same id, and Slurm counted the restart.
    runs = [json.loads(line) for line in starts.read_text().splitlines()]
    assert [r["job"] for r in runs] == [job, job], runs
    assert runs[1]["time"] - runs[0]["time"] < first_sleep  # the first run was cut short
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    assert re.search(r"\bRestarts=1\b", shown) and re.search(r"\bJobState=COMPLETED\b", shown), shown
    # One submission, at attempt 1: the requeue used no retry.
    calls = [c for c in cluster.sbatch_calls()[start:] if rule_of(c) == "prompts"]
    assert len(calls) == 1, calls
    assert "--requeue" in calls[0], calls[0]
    assert flag(calls[0], "--mem") == str(profile_resource("prompts", "mem_mb", 1))
    assert flag(calls[0], "-t") == str(profile_resource("prompts", "runtime", 1))
    assert "Error in rule" not in log and "Trying to restart" not in log, log[-4000:]
    # the output of the second run: every conversation but the one held out for testing
    assert len((workdir / "results/prompts/prompts.jsonl").read_text().splitlines()) == len(CONVERSATIONS) - 1
