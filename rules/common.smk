# Config validation, the plan (draftline.planning.plan), paths and small input functions shared by the rules.

import sys
from pathlib import Path

from snakemake.exceptions import IncompleteCheckpointException, WorkflowError
from snakemake.settings.types import RerunTrigger
from snakemake.utils import validate

REPO = Path(workflow.basedir)
SRC = REPO / "src"
# The step logic is imported from src/, here and in every job: Snakemake starts each `script:` with
# this process's sys.path (locally, in a Slurm job, in a conda env), so no PYTHONPATH (docs/DESIGN.md).
sys.path.insert(0, str(SRC))

from draftline.algorithms import draft_settings  # noqa: E402
from draftline.planning import plan as planning  # noqa: E402
from draftline.planning.config_files import EvaluationSets  # noqa: E402
from draftline.settings.command_line import CommandLineError, command_line_config, validation_error  # noqa: E402
from draftline.planning.rule_params import code_hash, pinned_versions  # noqa: E402
from draftline.sources import source_files  # noqa: E402

if "heldout" in (config.get("prompts") or {}):
    raise WorkflowError(planning.HELDOUT_SPLIT)
# --config values as the schema's types (Snakemake hands nested ones over as strings), and a
# validation error about one of them said to be the command line's, not a config file's.
_COMMAND_LINE = workflow.config_settings.config
try:
    command_line_config(config, _COMMAND_LINE)
    validate(config, schema="../config/schema/config.schema.yaml")
except CommandLineError as error:
    raise WorkflowError(str(error)) from None
except WorkflowError as error:
    if validation_error(error, _COMMAND_LINE) is None:
        raise
    raise WorkflowError(validation_error(error, _COMMAND_LINE)) from None


PLAN = planning.planned(config, workflow, sys.argv)  # decided here, not in jobs: params decide staleness
EVALUATION_SETS = EvaluationSets(config["evaluate"]["prompt_sets"])  # as the plan kept them
# What the rules read from the plan (PLAN itself for the stages' settings objects). TARGET_PATH is
# the folder jobs read, a param that never decides staleness (Snakemake skips a Path); the
# TARGET_IDENTITY param stands for its content. DEVICE_SETTING: the config's `device` as written,
# for the jobs' environment check, not compared (`planned` holds the device it resolves to).
TARGET, TARGET_IDENTITY, TARGET_DIR = PLAN.target, PLAN.target_identity, PLAN.target_dir
TARGET_PATH, VERIFIER_NAME, DEVICE, RESOLVED = Path(TARGET_DIR), PLAN.verifier_name, PLAN.device, PLAN.resolved
DEVICE_SETTING, ENGINE = PLAN.device_setting, PLAN.engine
# A vLLM job asks for one GPU (and thread) per rank of the target's split; the train rule for the
# Trainer's and the online server's; every GPU rule for one node (sbatch --nodes=1), as vLLM's ranks
# and torchrun's processes start on the job's node only (docs/cluster.md).
VLLM_RANKS, TRAIN_GPUS, ONE_NODE = PLAN.vllm_ranks, PLAN.default_train_gpus, 1


onstart:
    if RerunTrigger.CODE in workflow.rerun_triggers:  # code is tracked by content (the `code` param), not mtimes
        planning.say(planning.CODE_TRIGGER_ON)


onsuccess:
    # Two or three lines a user reads last: where the draft is, what it reached, what to run next.
    if not workflow.remote_exec:
        from draftline.stages.summary import end_of_run_lines

        for line in end_of_run_lines("results", PLAN.target.source if TARGET.kind == "hub" else TARGET_DIR):
            planning.say(line)


wildcard_constraints:
    shard=r"\d+",


def code(*modules, script):
    """A param: the content hash of scripts/<script>.py and of the draftline modules the step runs
    with all they import (draftline.planning.rule_params.code_hash). Bookkeeping (provenance, devices, logs) is not
    listed: a fix there changes no artifact and must not rerun hours of GPU work."""
    return code_hash(SRC, tuple(modules), REPO / "scripts" / f"{script}.py")


def versions(*packages):
    """A param: the versions requirements/ pins for the planned device ("vllm" = its build)."""
    return pinned_versions(REPO, DEVICE, packages)


def target_input():
    """The target folder as an input when rule target_model builds it (for the job order); a folder
    used in place is none, so moving or touching it reruns nothing (the `target` param is its content)."""
    return TARGET_DIR if TARGET.needs_rule else []


def conversations_to_tokenize():
    """What tokenize reads: the prompts, or the regenerated conversations as `ancient` (the merge
    rewrites them for a new shard count): their content decides (merged_answers, regeneration_settings)."""
    return _after_merge("conversations") if config["regenerate"]["enabled"] else "results/prompts/prompts.jsonl"


def merged_answers():
    """The merged conversations' sha256 file, so tokenize reruns exactly when the merge wrote other
    answers (on GPUs a new shard count may give other answers, or the same: known once the merge,
    a checkpoint, has run; Snakemake compares the file by its checksum, so the same answers rerun nothing)."""
    return _after_merge("answers") if config["regenerate"]["enabled"] else []


def _after_merge(output):
    """An input function: `output` of checkpoint regenerate_merge (the conversations `ancient`); while
    the merge is to run, its target marked ancient, so that it plans no tokenize by itself."""

    def after_merge(wildcards):
        try:
            merged = checkpoints.regenerate_merge.get().output
        except IncompleteCheckpointException as incomplete:
            return ancient(incomplete.targetfile)
        return ancient(merged.conversations) if output == "conversations" else merged[output]

    return after_merge


def regeneration_settings():
    """What decides the regenerated answers (target, settings, code, prompts by content): rewritten
    only when those change, so tokenize reruns then (a dry run shows it), not for a new shard count."""
    return "results/regenerated/settings.json" if config["regenerate"]["enabled"] else []


def regeneration_shards():
    return expand("results/regenerated/shard_{shard}", shard=range(config["regenerate"]["shards"]))


def hidden_state_shards():
    return expand("results/hidden_states/shard_{shard}", shard=PLAN.shards)


def hidden_states_output(path):
    """A hidden-state folder output: temp() under hidden_states.release_after_training, deleted once every job
    reading it ran; training lists the shards (always: switching it reruns nothing), so they outlive the view."""
    return temp(directory(path)) if config["hidden_states"]["release_after_training"] else directory(path)


ONLINE = config["hidden_states"]["mode"] == "online"  # no hidden-state files: no disk plot
PLOTS = ["loss", "acceptance", "vocab_coverage", *([] if ONLINE else ["hidden_states_disk"]), "wall_times"]


def report_plots():
    return expand("results/report/{plot}.png", plot=PLOTS)


def all_outputs():
    """The final draft (the main target), its evaluation, the report's plots, the lineage of all
    three, and the run's one-page summary (rules/summary.smk)."""
    return ["results/checkpoint/final", "results/eval/acceptance.json", *report_plots(), "results/lineage.json",
            "results/summary.md"]
