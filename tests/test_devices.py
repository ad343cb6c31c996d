"""Local GPU jobs get distinct devices; Slurm's allocation is kept (faked GPU counts, no GPU needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from draftline.runtime import devices
from draftline.runtime.devices import GpuClaimError, claim_gpus

REPO = Path(__file__).resolve().parents[1]

# A GPU job: claim, report the devices on stdout, hold them until `release` exists.
JOB = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from draftline.runtime.devices import claim_gpus
    got = claim_gpus(int(sys.argv[1]), poll_s=0.1)
    print(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
""")


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """A machine with 2 GPUs (faked) and a private lock folder, outside any Slurm job."""
    monkeypatch.setenv("DRAFTLINE_GPU_COUNT", "2")
    monkeypatch.setenv("DRAFTLINE_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    yield env
    devices.release_gpus()


def start_job(env, count: int, release: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", JOB, str(count), str(release)],
                            env=env, stdout=subprocess.PIPE, text=True)


def test_two_concurrent_local_jobs_get_different_devices(fake_gpus, tmp_path):
    release = tmp_path / "release"
    jobs = [start_job(fake_gpus, 1, release) for _ in range(2)]
    try:
        seen = [job.stdout.readline().strip() for job in jobs]
    finally:
        release.touch()
        for job in jobs:
            job.wait(timeout=30)
    assert sorted(seen) == ["0", "1"]


def test_a_third_job_waits_until_a_device_is_free(fake_gpus, tmp_path):
    first_release, second_release = tmp_path / "r1", tmp_path / "r2"
    holder = start_job(fake_gpus, 2, first_release)
    assert holder.stdout.readline().strip() == "0,1"
    waiter = start_job(fake_gpus, 1, second_release)
    try:
        time.sleep(1.0)
        assert waiter.poll() is None  # still waiting: both devices are held
        first_release.touch()
        holder.wait(timeout=30)
        assert waiter.stdout.readline().strip() in {"0", "1"}
    finally:
        first_release.touch()
        second_release.touch()
        waiter.wait(timeout=30)


def test_a_killed_job_frees_its_device(fake_gpus, tmp_path):
    job = start_job(fake_gpus, 2, tmp_path / "never")
    assert job.stdout.readline().strip() == "0,1"
    with pytest.raises(GpuClaimError, match="no 1 free GPU"):
        claim_gpus(1, poll_s=0.05, timeout_s=0.2)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=30)
    assert claim_gpus(1, timeout_s=5) in (["0"], ["1"])


def test_claim_respects_a_user_device_mask(fake_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert claim_gpus(1) == ["2"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


def test_inside_a_slurm_job_the_allocation_is_kept(fake_gpus, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert claim_gpus(1) == ["1"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert not (tmp_path / "locks").exists()  # no local slot taken


def test_local_jobs_inside_a_bigger_allocation_share_it_out(fake_gpus, monkeypatch):
    # e.g. `salloc --gpus=2` then a local snakemake run: slots within the allocation
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    first = claim_gpus(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    second = claim_gpus(1)
    assert sorted(first + second) == ["0", "1"]


def test_cpu_jobs_and_gpu_less_machines_are_left_alone(fake_gpus, monkeypatch):
    assert claim_gpus(0) == []
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("DRAFTLINE_GPU_COUNT", "0")
    assert claim_gpus(1) == []
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_asking_for_more_gpus_than_visible_says_so(fake_gpus):
    with pytest.raises(GpuClaimError, match="asks for 3 GPUs but only 2"):
        claim_gpus(3)
