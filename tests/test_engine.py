"""vLLM CPU placement for split targets (draftline.engine); fast, no engines (the engines run
split in tests/test_regenerate.py, test_hidden_states.py and test_evaluate.py)."""

import os

import pytest

from draftline import engine
from draftline.engine import BIND, NotEnoughCores, configure_vllm_cpu, cpu_bind_lists


def test_each_rank_gets_cores_of_its_own():
    assert cpu_bind_lists(2, {1, 0}) == "0|1"
    assert cpu_bind_lists(2, range(8)) == "0,1,2,3|4,5,6,7"
    assert cpu_bind_lists(2, range(8), threads=4) == "0,1|2,3"  # the job's threads, not the machine
    assert cpu_bind_lists(2, range(8), threads=1) == "0|1"  # at least one core a rank
    assert cpu_bind_lists(4, [3, 5, 7, 9, 11]) == "3|5|7|9"


def test_fewer_cores_than_ranks_names_the_setting():
    with pytest.raises(NotEnoughCores, match=r"= 4 vLLM CPU ranks.* only 2 core\(s\) \(0,1\).*VLLM_CPU_OMP_THREADS_BIND"):
        cpu_bind_lists(4, {0, 1})


@pytest.fixture
def cpu_env(monkeypatch):
    """A CPU machine with cores {0, 1} and none of the variables set."""
    monkeypatch.setattr(engine, "has_cuda", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for key in (BIND, "OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(engine, "_set_here", {})


def test_split_engine_after_an_unsplit_one_in_the_same_process(cpu_env):
    configure_vllm_cpu(threads=1)
    assert (os.environ[BIND], os.environ["OMP_NUM_THREADS"]) == ("nobind", "1")
    configure_vllm_cpu(threads=2, ranks=2)  # replaces what draftline set, not what the user did
    assert os.environ[BIND] == "0|1" and "OMP_NUM_THREADS" not in os.environ
    configure_vllm_cpu(threads=1)
    assert (os.environ[BIND], os.environ["OMP_NUM_THREADS"]) == ("nobind", "1")
    configure_vllm_cpu()
    assert BIND not in os.environ


def test_the_users_placement_wins(cpu_env, monkeypatch):
    monkeypatch.setenv(BIND, "1|0")
    configure_vllm_cpu(threads=2, ranks=4)  # no error: the user placed the ranks
    assert os.environ[BIND] == "1|0"
    monkeypatch.delenv(BIND)
    with pytest.raises(NotEnoughCores, match=BIND):
        configure_vllm_cpu(threads=2, ranks=4)
