"""Which environment ./draftline builds (DRAFTLINE_ENV), and the check at the start of every GPU
job that its torch build matches its device (draftline.planning.rule_params.check_job_environment).

These tests read which pinned list ./draftline would install from the line it prints before
installing, with a Python that stops right there; tests/test_gpu_environment.py builds the GPU
environment for real. The real-Slurm case (a job that sees GPUs, planned from a machine without
one) is in tests/test_slurm.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from pathlib import Path

import pytest

from draftline.planning import rule_params as plan
from draftline.planning.rule_params import PlanError, check_job_environment

REPO = Path(__file__).resolve().parents[1]


GPU_LOCK = "requirements/gpu-vllm0.26-py3.11.lock.txt"  # the default GPU lock of the Python the fake one says it is


def draftline(tmp_path: Path, *, env_choice: str | None = None, built: str | None = None,
              nvidia: bool = False, python_version: str = "3.11") -> subprocess.CompletedProcess:
    """`./draftline true` with a scratch venv folder; `built` writes the stamp of an environment
    already built for that kind, `nvidia` puts an nvidia-smi that lists one GPU on PATH, and the
    Python it is given says it is `python_version`."""
    venv = tmp_path / "venv"
    venv.mkdir(exist_ok=True)
    if built is not None:
        req = REPO / (GPU_LOCK if built == "gpu" else "requirements/cpu.lock.txt")
        lock = " vllm0.26" if built == "gpu" else ""
        (venv / ".draftline-requirements").write_text(f"{built} {hashlib.sha256(req.read_bytes()).hexdigest()}{lock}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.unlink(missing_ok=True)
    if nvidia:
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
        smi.chmod(0o755)
    # a "python" that answers ./draftline's question for its version and fails where the venv would be made
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nif [ "$1" = -c ]; then echo {python_version}; exit 0; fi\nexit 1\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "DRAFTLINE_ENV"}
    # a PATH without any real nvidia-smi
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", DRAFTLINE_VENV=str(venv), DRAFTLINE_PYTHON=str(python))
    if env_choice is not None:
        env["DRAFTLINE_ENV"] = env_choice
    return subprocess.run([str(REPO / "draftline"), "true"], capture_output=True, text=True, env=env, timeout=60)


def builds(result: subprocess.CompletedProcess) -> str | None:
    """"gpu requirements/gpu-vllm0.26-py3.11.lock.txt" from the line ./draftline prints before building; None if it did not build."""
    for line in result.stderr.splitlines():
        if line.startswith("draftline: setting up"):
            words = line.split()
            return f"{words[words.index('for') + 1]} {words[words.index('from') + 1]}"
    return None


def test_env_choice_builds_the_gpu_environment_on_a_machine_without_gpu(tmp_path):
    # a login node: no nvidia-smi; DRAFTLINE_ENV=gpu builds the GPU list anyway
    assert builds(draftline(tmp_path, env_choice="gpu")) == f"gpu {GPU_LOCK}"
    # without the choice the same machine builds the CPU list, as before
    assert builds(draftline(tmp_path)) == "cpu requirements/cpu.lock.txt"
    # on a GPU machine auto builds the GPU list, and DRAFTLINE_ENV=cpu overrides it
    assert builds(draftline(tmp_path, nvidia=True)) == f"gpu {GPU_LOCK}"
    assert builds(draftline(tmp_path, env_choice="cpu", nvidia=True)) == "cpu requirements/cpu.lock.txt"


def test_env_choice_sticks_to_the_environment_that_was_built(tmp_path):
    # a GPU environment built on the login node is used as it is by a later plain ./draftline
    # there (auto does not rebuild it for the CPU), and rebuilt only when asked for another kind
    used = draftline(tmp_path, built="gpu")
    assert used.returncode == 0 and builds(used) is None, used.stderr
    assert builds(draftline(tmp_path, built="gpu", env_choice="cpu")) == "cpu requirements/cpu.lock.txt"
    assert builds(draftline(tmp_path, built="cpu", nvidia=True)) is None


def test_the_gpu_environment_installs_the_lock_of_its_python(tmp_path):
    assert builds(draftline(tmp_path, env_choice="gpu", python_version="3.12")) == \
        "gpu requirements/gpu-vllm0.26-py3.12.lock.txt"
    result = draftline(tmp_path, env_choice="gpu", python_version="3.10")
    assert result.returncode == 2 and builds(result) is None
    assert "no GPU lock vllm0.26 for Python 3.10" in result.stderr
    assert "gpu-vllm0.26-py3.11.lock.txt gpu-vllm0.26-py3.12.lock.txt; set DRAFTLINE_PYTHON" in result.stderr
    # the CPU list does not depend on it
    assert builds(draftline(tmp_path, python_version="3.10")) == "cpu requirements/cpu.lock.txt"


def test_env_choice_rejects_an_unknown_value(tmp_path):
    result = draftline(tmp_path, env_choice="cuda")
    assert result.returncode == 2
    assert "DRAFTLINE_ENV=cuda: use gpu, cpu or auto" in result.stderr


# ------------------------------------------------------------------ the check inside a job


@pytest.fixture
def node(monkeypatch):
    """Set what a job sees: its torch build and the GPUs its node offers (Slurm's)."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(plan, "machine_has_nvidia_gpu", lambda: False)

    def set_node(torch: str, cuda_available: bool = False, slurm_gpus: str | None = None):
        monkeypatch.setattr(plan, "torch_build", lambda: (torch, "+cpu" not in torch, cuda_available))
        if slurm_gpus is not None:
            monkeypatch.setenv("SLURM_JOB_ID", "42")
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", slurm_gpus)

    return set_node


def test_a_cpu_torch_on_a_gpu_node_planned_for_cuda_stops_and_says_how_to_build(node):
    node("2.13.0+cpu", slurm_gpus="0")
    with pytest.raises(PlanError) as error:
        check_job_environment({"device": "cuda"}, setting="cuda")
    message = str(error.value)
    assert "torch 2.13.0+cpu is a CPU build" in message
    assert "offers GPUs 0 (CUDA_VISIBLE_DEVICES, given by Slurm job 42)" in message
    assert "DRAFTLINE_ENV=gpu ./draftline" in message


def test_a_cpu_plan_from_a_gpu_less_login_node_stops_on_a_gpu_node(node, caplog):
    # device: auto on the login node planned cpu; the job landed where Slurm gives it GPUs
    node("2.13.0+cpu", slurm_gpus="0,1")
    with pytest.raises(PlanError, match=r"device: auto.*offers GPUs 0,1.*plan with device: cuda"):
        check_job_environment({"device": "cpu"}, setting="auto")
    # device: cpu chosen on purpose runs, and says so in the job's log
    with caplog.at_level(logging.INFO, logger="draftline.planning.rule_params"):
        check_job_environment({"device": "cpu"}, setting="cpu")
    assert "computing on the CPU with torch 2.13.0+cpu although this node offers GPUs 0,1" in caplog.text


def test_a_cuda_torch_planned_for_cpu_stops(node):
    node("2.13.0+cu130", cuda_available=False)
    with pytest.raises(PlanError, match=r"planned for CPU .* the GPU one \(torch 2.13.0\+cu130.*DRAFTLINE_ENV=cpu"):
        check_job_environment({"device": "cpu"}, setting="cpu")
    node("2.13.0+cu130", cuda_available=True)
    with pytest.raises(PlanError, match="runs where CUDA is available"):
        check_job_environment({"device": "cpu"}, setting="cpu")


def test_matching_environments_pass(node):
    node("2.13.0+cpu")
    check_job_environment({"device": "cpu"}, setting="auto")  # a CPU machine, CPU torch
    node("2.13.0+cu130", cuda_available=True, slurm_gpus="0")
    check_job_environment({"device": "cuda"}, setting="cuda")  # a GPU node, CUDA torch


# ------------------------------------------------------------------ the pins the plan reads


def test_the_plan_reads_the_gpu_pins_from_the_locks_and_refuses_locks_that_disagree(tmp_path, monkeypatch):
    import shutil

    monkeypatch.delenv("DRAFTLINE_GPU_LOCKFILE", raising=False)
    assert plan.pinned_versions(REPO, "cuda", ("vllm", "torch", "speculators", "transformers")) == {
        "speculators": "0.9.0", "torch": "2.11.0", "transformers": "5.19.0", "vllm": "0.26.0",
    }  # the default GPU lock's (requirements/gpu-vllm0.26.in), as the locks resolved them
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    lock = tmp_path / "requirements/gpu-vllm0.26-py3.12.lock.txt"
    lock.write_text(lock.read_text().replace("\nvllm==0.26.0\n", "\nvllm==0.99.0\n"))
    with pytest.raises(ValueError, match=r"vllm: requirements/gpu-vllm0.26-py3.11.lock.txt pins 0.26.0, "
                                         r"requirements/gpu-vllm0.26-py3.12.lock.txt pins 0.99.0; .*requirements/lock.sh"):
        plan.pinned_versions(tmp_path, "cuda", ("vllm",))
    lock = tmp_path / "requirements/gpu-vllm0.26-py3.11.lock.txt"
    lock.write_text(lock.read_text().replace("\nvllm==0.26.0\n", "\nvllm==0.99.0\n"))
    assert plan.pinned_versions(tmp_path, "cuda", ("vllm", "torch")) == {"torch": "2.11.0", "vllm": "0.99.0"}


# ------------------------------------------------------------------ which GPU lock, an environment as it is


def test_the_gpu_lock_is_chosen_by_name_and_kept_with_the_environment(tmp_path, monkeypatch):
    # the default is the lock that ran on an H200 (requirements/gpu-lockfiles.txt's first line)
    assert builds(draftline(tmp_path, env_choice="gpu")) == "gpu requirements/gpu-vllm0.26-py3.11.lock.txt"
    monkeypatch.setenv("DRAFTLINE_GPU_LOCKFILE", "vllm0.32")
    assert builds(draftline(tmp_path, env_choice="gpu")) == "gpu requirements/gpu-vllm0.32-py3.11.lock.txt"
    monkeypatch.setenv("DRAFTLINE_GPU_LOCKFILE", "vllm9")
    refused = draftline(tmp_path, env_choice="gpu")
    assert refused.returncode == 2 and "DRAFTLINE_GPU_LOCKFILE=vllm9: use one of vllm0.26 vllm0.32" in refused.stderr
    # an environment built from the newest lock stays that one when the variable is not set again
    monkeypatch.delenv("DRAFTLINE_GPU_LOCKFILE")
    venv = tmp_path / "venv"
    lock = REPO / "requirements/gpu-vllm0.32-py3.11.lock.txt"
    (venv / ".draftline-requirements").write_text(f"gpu {hashlib.sha256(lock.read_bytes()).hexdigest()} vllm0.32\n")
    kept = draftline(tmp_path)
    assert kept.returncode == 0 and builds(kept) is None, kept.stderr


def test_the_plan_reads_the_pins_of_the_chosen_gpu_lock(monkeypatch):
    monkeypatch.setenv("DRAFTLINE_GPU_LOCKFILE", "vllm0.32")
    assert plan.pinned_versions(REPO, "cuda", ("vllm", "torch")) == {"torch": "2.13.0", "vllm": "0.32.0"}
    monkeypatch.setenv("DRAFTLINE_GPU_LOCKFILE", "nightly")
    with pytest.raises(ValueError, match="DRAFTLINE_GPU_LOCKFILE=nightly: use one of vllm0.26, vllm0.32"):
        plan.pinned_versions(REPO, "cuda", ("vllm",))


def use_env(prefix: Path, kind: str, *command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DRAFTLINE_VENV", "DRAFTLINE_GPU_LOCKFILE")}
    env.update(DRAFTLINE_USE_ENV=str(prefix), DRAFTLINE_ENV=kind)
    return subprocess.run([str(REPO / "draftline"), *command], capture_output=True, text=True, env=env, timeout=300)


def test_an_existing_environment_is_used_as_it_is_and_its_differences_named(tmp_path):
    """DRAFTLINE_USE_ENV (a cluster's module, a container, the GPU test host's bundle): nothing is
    installed, every pin that differs is named, and the command runs with that Python."""
    import sys

    prefix = Path(sys.prefix)  # the test session's own environment: the CPU lock's
    stamp = prefix / ".draftline-requirements"
    before = stamp.read_text() if stamp.exists() else None
    used = use_env(prefix, "cpu", "python", "-c", "import sys; print(sys.prefix)")
    assert used.returncode == 0, used.stderr
    assert used.stdout.strip() == str(prefix)
    assert "as it is (DRAFTLINE_USE_ENV), against cpu.lock.txt" in used.stderr
    assert "setting up" not in used.stderr
    assert (stamp.read_text() if stamp.exists() else None) == before
    # against the GPU lock the same environment runs, and says which planned pins its jobs would refuse
    gpu = use_env(prefix, "gpu", "true")
    assert gpu.returncode == 0, gpu.stderr
    assert "jobs will stop on their pin check: vllm not installed (locked 0.26.0), torch 2.13.0+cpu (locked 2.11.0)" \
        in gpu.stderr
    # an environment without what the jobs import stops, naming the modules
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    (bare / "bin" / "python").symlink_to(Path(sys._base_executable).resolve())
    refused = use_env(bare, "cpu", "true")
    assert refused.returncode == 2
    assert "the environment lacks what every job imports: snakemake (ModuleNotFoundError" in refused.stderr
