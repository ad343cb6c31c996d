# Config validation, the target's location, and small input functions shared by the rules.

import functools
import json
import os
import sys
from pathlib import Path

from snakemake.exceptions import IncompleteCheckpointException, WorkflowError
from snakemake.settings.types import RerunTrigger
from snakemake.utils import validate

REPO = Path(workflow.basedir)
SRC = REPO / "src"
# The step logic is imported from src/, here and in every job: Snakemake starts each `script:`
# with this process's sys.path (locally, in a Slurm job's own snakemake, and in a conda env,
# where it drops PYTHONPATH), so no environment variable is needed (docs/DESIGN.md).
sys.path.insert(0, str(SRC))

from draftline.checks import ConfigError, check_config, target_shape  # noqa: E402
from draftline.cluster import cluster_device, jobs_leave_this_machine, snakemake_executor  # noqa: E402
from draftline.engine import EngineSettingsError, engine_settings, output_settings  # noqa: E402
from draftline.disk import (  # noqa: E402
    DiskLimitError,
    check_limit,
    parse_time_estimate,
    plan_lines,
    row_lengths,
    upper_bound_estimate,
)
from draftline.fidelity import FidelitySettings, resolve_min_top1  # noqa: E402
from draftline.plan import PlanError, code_hash, pinned_versions, resolved_settings  # noqa: E402
from draftline.sizing import planned_training_rows  # noqa: E402
from draftline.sources import PromptError, check_sources, source_files  # noqa: E402
from draftline.target_hashes import SharedHashCache, local_target_files  # noqa: E402
from draftline.target_model import resolve_target, target_identity  # noqa: E402

if "heldout" in (config.get("prompts") or {}):
    raise WorkflowError(
        "prompts.heldout was split into prompts.validation (choose settings on it) and "
        "prompts.test (report it, never tune on it); replace the key in your config"
    )
validate(config, schema="../config/schema/config.schema.yaml")

# Relative paths in the config are relative to the working folder (the checkout, or a run
# folder given with --directory, where results/ and resources/target/ land too).
WORKDIR = Path.cwd()


def _check_relative_path(key, raw):
    """A relative path missing from a run folder that the workflow's own folder has (a preset's
    resources/prompts/default.jsonl, say): name both, and the path that reaches it from here."""
    path = Path(str(raw)).expanduser()
    if path.is_absolute() or str(raw).startswith("hf:") or path.exists() or WORKDIR == REPO:
        return
    if (REPO / path).exists():
        raise WorkflowError(
            f"{key}: {raw} is not in the working folder (looked at {path.resolve()}): relative paths in the "
            f"config are read from the folder snakemake runs in ({WORKDIR}, --directory), not from the "
            f"workflow's ({REPO}), which has it. Write {os.path.relpath(REPO / path)} (or an absolute path), "
            "or copy the file into the run folder"
        )


for _raw in config["prompts"]["sources"]:
    _check_relative_path("prompts.sources", _raw)
for _name, _raw in config["evaluate"]["prompt_sets"].items():
    _check_relative_path(f"evaluate.prompt_sets.{_name}", _raw)
for _key in ("model", "chat_template"):
    if config["target"][_key] not in (None, "embedded"):
        _check_relative_path(f"target.{_key}", config["target"][_key])

# Cheap checks at parse time, so a typo, a wrong column name or a file in the wrong format stops
# the run before any job starts (the first rows of every source, in every format).
try:
    check_sources(
        config["prompts"]["sources"],
        config["regenerate"]["enabled"],
        config["prompts"]["on_bad_row"],
    )
except (PromptError, ValueError) as error:
    raise WorkflowError(f"prompts.sources: {error}") from None
for _name, _raw in config["evaluate"]["prompt_sets"].items():
    try:  # evaluation stops on a bad row (draftline.sources.read_first_turns)
        check_sources([_raw], regenerate_enabled=True, on_bad_row="stop")
    except (PromptError, ValueError) as error:
        raise WorkflowError(f"evaluate.prompt_sets.{_name}: {error}") from None
TARGET = resolve_target(
    config["target"]["model"],
    name=config["target"]["name"],
    chat_template=config["target"]["chat_template"],
    repo_root=WORKDIR,
    revision=config["target"]["revision"],
)
# A local target's files are hashed once per file version, with a progress line when that is
# big, and the hashes kept for every run folder of the user (draftline.target_hashes).
_hash_cache = SharedHashCache(".snakemake/draftline/hash_cache.json")
_local_target = local_target_files(TARGET, WORKDIR)
if _local_target is not None:
    _hash_cache.hash_ahead(_local_target[1], f"the target folder {_local_target[0]}",
                           lambda line: print(f"draftline: {line}", file=sys.stderr))  # fmt: skip
TARGET_IDENTITY = target_identity(TARGET, WORKDIR, _hash_cache)
# What the published draft names as its verifier: never a local path (target.verifier_name).
VERIFIER_NAME = config["target"]["verifier_name"] or (TARGET.source if TARGET.kind == "hub" else TARGET.name)
_hash_cache.save()
TARGET_DIR = str(TARGET.dir)
# The folder jobs read, as a param that never decides staleness (a Path is not compared:
# Snakemake skips params it cannot represent); the TARGET_IDENTITY param stands for its content.
TARGET_PATH = Path(TARGET_DIR)
SHARDS = list(range(config["hidden_states"]["shards"]))


def _set_gpus(step):
    """The `gpu` a profile or --set-resources sets for `step` (a rule name); None when unset, the text of an
    expression only the job knows (e.g. "2 * attempt")."""
    settings = (workflow.resource_settings.overwrite_resources or {}).get(step)
    gpu = settings.get("gpu") if settings is not None else None
    value = getattr(gpu, "value", gpu)  # a Resource (9.x) or a plain value
    if value in (None, ""):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value)


def _train_gpus():
    """GPUs the train rule asks for (its `gpu` resource as a profile or --set-resources sets it)."""
    gpus = _set_gpus("train")
    return gpus if isinstance(gpus, int) else TRAIN_GPUS  # an expression: checked in the job


# The train rule's default: one GPU for the Trainer, plus the online hidden-state server's.
TRAIN_GPUS = 1 + (config["hidden_states"]["online_server_gpus"] if config["hidden_states"]["mode"] == "online" else 0)


# Decided here, not inside jobs, so they are params and decide staleness (draftline.plan). With
# a cluster executor the jobs run on its nodes, not here: auto plans cuda there, and cpu needs
# cpu_on_cluster too (draftline.cluster; a cluster job decides the same from the same config).
EXECUTOR = snakemake_executor()
ON_CLUSTER = workflow.remote_exec or jobs_leave_this_machine(EXECUTOR)
try:
    DEVICE = cluster_device(config["device"], ON_CLUSTER, config["cpu_on_cluster"], EXECUTOR)
except PlanError as error:
    raise WorkflowError(str(error)) from None
RESOLVED = resolved_settings(config, DEVICE, _train_gpus())
if not workflow.remote_exec:
    where = f"; the jobs run on the {EXECUTOR} executor's nodes" if ON_CLUSTER else ""
    print(
        f"draftline: planned for {DEVICE} (device: {config['device']}{where}): "
        + ", ".join(f"{k} {v}" for k, v in sorted({**RESOLVED["engine"], **RESOLVED["train"]}.items()) if k != "device"),
        file=sys.stderr,
    )


onstart:
    # Code is tracked by content (the `code` param), not by the scripts' mtimes: Snakemake's
    # `code` trigger would rerun everything after a fresh clone. The profiles switch it off.
    if RerunTrigger.CODE in workflow.rerun_triggers:
        print(
            "draftline: warning: Snakemake's `code` rerun trigger is on (no draftline profile "
            "loaded?): after a fresh clone every step reruns for its scripts' new mtimes. Add "
            "`--rerun-triggers mtime params input software-env` (profiles/default sets it).",
            file=sys.stderr,
        )


wildcard_constraints:
    shard=r"\d+",


# vLLM's split of the target over devices (target.tensor_parallel_size x pipeline_parallel_size):
# every job that loads the target in vLLM asks for one GPU per rank (`gpu`, so the Slurm profile
# submits --gpus accordingly and local jobs claim that many) and as many threads (on CPU each
# rank is a worker process bound to a core of its own).
VLLM_RANKS = config["target"]["tensor_parallel_size"] * config["target"]["pipeline_parallel_size"]
# The GPU rules' `nodes` resource (sbatch --nodes=1 through the Slurm plugin) holds all of a job's
# GPUs to one node. vLLM's ranks and torchrun's processes are started on the job's node only, and
# `--gpus=8` alone lets Slurm spread the 8 GPUs over several nodes. The rules' own resource, so
# no profile or --set-resources on the command line has to remember it.
ONE_NODE = 1


VLLM_RULES = ("regenerate_shard", "hidden_states_shard", "evaluate", "preflight_environment", "preflight_regenerate",
              "preflight_hidden_states", "preflight_speculative")  # fmt: skip
for _step in VLLM_RULES:
    if _set_gpus(_step) not in (None, VLLM_RANKS):
        raise WorkflowError(
            f"the profile (or --set-resources) gives rule {_step} gpu={_set_gpus(_step)}, but vLLM splits "
            f"the target over target.tensor_parallel_size x pipeline_parallel_size = {VLLM_RANKS} GPUs and "
            f"the rule asks for that many itself; remove `gpu` under {_step} in the profile"
        )


def vllm_parallel():
    """A param of the rules that load the target in vLLM: the split changes the order of float
    reductions (answers and hidden states can differ in the last bits), so a change reruns them."""
    return {key: config["target"][key] for key in ("pipeline_parallel_size", "tensor_parallel_size")}


try:  # the one vLLM engine settings object of the plan (the `vllm:` block, target.*, RESOLVED)
    ENGINE = engine_settings(config, RESOLVED["engine"])
except EngineSettingsError as error:
    raise WorkflowError(str(error)) from None


def vllm_engine(without=()):
    """The params every vLLM job gets. `engine`, the EngineSettings its script
    hands on as it is (an object, which Snakemake skips: speed-only settings rerun nothing),
    `engine_outputs`, its fields that can change outputs (plain values that decide staleness;
    `without` those the stage does not use), and `planned`: device and dtype (a job elsewhere stops)."""
    return dict(
        engine=ENGINE,
        engine_outputs=output_settings(ENGINE, without),
        planned={k: v for k, v in RESOLVED["engine"].items() if k != "enforce_eager"},
    )


def extraction_parallel():
    """vllm_parallel() for the vllm hidden-state backend; the transformers backend ignores it."""
    return vllm_parallel() if config["hidden_states"]["backend"] == "vllm" else {}


def code(*modules, script):
    """A param: the content hash of scripts/<script>.py, of the draftline modules the step runs
    and of every draftline module they import (parsed with ast, transitively), so a fix in
    one reruns the step, and a move or a fresh clone (same content) reruns nothing.
    Bookkeeping the scripts import (provenance, devices, logs) is deliberately not listed: a
    fix there changes no artifact and must not rerun hours of GPU work."""
    return code_hash(SRC, tuple(modules), REPO / "scripts" / f"{script}.py")


def versions(*packages):
    """A param: the versions requirements/ pins for the planned device ("vllm" = its build)."""
    return pinned_versions(REPO, DEVICE, packages)


def target_input():
    """The target folder as an input when rule target_model builds it (for the job order); a
    folder used in place is no input, so moving it or touching it reruns nothing: its content
    is in every rule's `target` param."""
    return TARGET_DIR if TARGET.needs_rule else []


def conversations_to_tokenize():
    """What tokenize reads: the prompts, or the regenerated conversations as `ancient` (their
    mtime changes whenever the merge runs, e.g. for a new shard count); what decides when they
    changed is `merged_answers()` (their content) and `regeneration_settings()`."""
    if config["regenerate"]["enabled"]:
        return _after_merge("conversations")
    return "results/prompts/prompts.jsonl"


def merged_answers():
    """The merged conversations' sha256 file, so tokenize (and what follows) reruns exactly when
    the merge wrote other answers. On GPUs vLLM's answers can change with batch composition, so
    a new shard count or chunk size may give other answers, or the same; which one is known only
    once the merge has run: regenerate_merge is a checkpoint, after which Snakemake re-plans
    tokenize, and Snakemake compares the file by its recorded checksum (files under 1 MB), so the
    same answers rewritten rerun nothing."""
    return _after_merge("answers") if config["regenerate"]["enabled"] else []


def _after_merge(output):
    """An input function: `output` of checkpoint regenerate_merge (the conversations `ancient`).
    While the merge is still to run: Snakemake's own checkpoint target (the merged file), marked
    ancient so that planning the merge does not plan tokenize by itself; Snakemake decides
    tokenize again once the merge is done."""

    def after_merge(wildcards):
        try:
            merged = checkpoints.regenerate_merge.get().output
        except IncompleteCheckpointException as incomplete:
            return ancient(incomplete.targetfile)
        return ancient(merged.conversations) if output == "conversations" else merged[output]

    return after_merge


def regeneration_settings():
    """What decides the regenerated answers (target, settings, code, prompts by content):
    rewritten only when those change, so tokenize reruns then (and the dry run shows it before
    anything runs) and not for a new shard count."""
    return "results/regenerated/settings.json" if config["regenerate"]["enabled"] else []


def regeneration_shards():
    return expand("results/regenerated/shard_{shard}", shard=range(config["regenerate"]["shards"]))


def evaluation_prompt_set_files():
    """The files of evaluate.prompt_sets (a dataset folder's files too), so an edit reruns evaluation."""
    return source_files(list(config["evaluate"]["prompt_sets"].values()))


def fidelity_settings():
    """hidden_states.fidelity with its `auto` bar resolved for where the answers come from, as a
    param that does not decide staleness (a FidelitySettings object: Snakemake compares only plain
    values): the bar gates a shard's publishing, it is not what the states are, so a new bar reruns
    no published shard, and a shard that failed reruns under it reusing its staged files."""
    block = config["hidden_states"]["fidelity"]
    bar, basis = resolve_min_top1(
        block["min_top1"], config["regenerate"]["enabled"], config["regenerate"]["temperature"]
    )
    return FidelitySettings(rows=block["rows"], min_top1=bar, basis=basis)


def hidden_state_shards():
    return expand("results/hidden_states/shard_{shard}", shard=SHARDS)


# hidden_states.release_after_training: the shards and the view are temp(), so Snakemake deletes
# them once every job reading them (the view, training, the disk plot) has run; training lists
# the shards among its inputs (always, so switching the option reruns nothing) so they outlive
# the view until it is done. A later rerun of training re-extracts them first.
RELEASE_SHARDS = config["hidden_states"]["release_after_training"]


def hidden_states_output(path):
    """A hidden-state folder output: temp() under hidden_states.release_after_training."""
    return temp(directory(path)) if RELEASE_SHARDS else directory(path)


def shards_read_by_training():
    """The shards as training inputs (for the release order; the view is what it reads)."""
    return hidden_state_shards()


PLOTS = ["loss", "acceptance", "vocab_coverage", "hidden_states_disk", "wall_times"]
ONLINE = config["hidden_states"]["mode"] == "online"  # no hidden-state files: no disk plot
PLOTS = [p for p in PLOTS if not (ONLINE and p == "hidden_states_disk")]


def report_plots():
    return expand("results/report/{plot}.png", plot=PLOTS)


def all_outputs():
    """The final draft (the main target), its evaluation, the report's plots, the lineage of all
    three, and the run's one-page summary (rules/summary.smk)."""
    return [
        "results/checkpoint/final",
        "results/eval/acceptance.json",
        *report_plots(),
        "results/lineage.json",
        "results/summary.md",
    ]


def _sort_keys(value):
    if isinstance(value, dict):
        return {k: _sort_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sort_keys(v) for v in value]
    return value


# The run's name (report title, summary): the work folder's unless set. Read by the report and
# the summary job only, never a param, so a moved or renamed folder reruns nothing.
config["run_name"] = config["run_name"] or Path.cwd().name


# A dict param (train=config["train"]) is compared by its repr: sorted keys, so reordering
# config.yaml or the schema's defaults never reruns a job. Lists keep their order (it matters).
for _key in sorted(config):
    config[_key] = _sort_keys(config.pop(_key))


# The config against the target's shape, and the hidden states' disk use (draftline.checks,
# draftline.disk; the rule is in rules/disk.smk).

try:
    TARGET_SHAPE = target_shape(TARGET.kind, TARGET.config_folder)
    check_config(config, TARGET_SHAPE, DEVICE)
except ConfigError as error:
    raise WorkflowError(str(error)) from None


@functools.cache
def _planned_rows():
    """Training rows before tokenization, for the disk plan and the sizing: the sources counted
    once a parse (draftline.sizing.planned_training_rows)."""
    return planned_training_rows(config, "results/prompts/summary.json")


def _hidden_state_disk_use():
    """While shards are still to extract (or in another format): print each stage's expected disk
    use for the chosen format and mode (from the tokenized summary, or before tokenization an
    upper bound from the prompt count x tokenize.max_seq_len) and hold an offline run to
    hidden_states.max_disk_gb, which may have changed since the rule ran (the limit is not a
    param, so changing it re-extracts nothing)."""
    hs = config["hidden_states"]
    mode = hs.get("mode", "offline")  # hidden_states.mode (online: no shard files)
    def same_format(shard):
        try:
            return json.loads((Path(shard) / "manifest.json").read_text()).get("format", "full") == hs["format"]
        except (OSError, ValueError):
            return True  # no readable manifest: the job decides

    shards = hidden_state_shards()
    if mode != "online" and all(Path(d).exists() and same_format(d) for d in shards):
        return
    if TARGET_SHAPE is None:
        return
    layer_ids = Path("results/target/layer_ids.json")
    try:
        n_layers = len(json.loads(layer_ids.read_text())["extracted"])
    except (OSError, ValueError, KeyError, TypeError):  # not yet (or not readable): as configured
        n_layers = (3 if hs["layer_ids"] == "auto" else len(hs["layer_ids"])) + 1  # auto: 3 aux + last
    dtype = RESOLVED["engine"]["dtype"]
    est = parse_time_estimate("results/tokenized/summary.json", TARGET_SHAPE.hidden_size, n_layers, dtype,
                              hs["format"])  # fmt: skip
    source = "from results/tokenized/summary.json"
    if est is None:
        rows = _planned_rows()[0]
        if rows is None:
            return
        max_seq_len = config["tokenize"]["max_seq_len"]
        est = upper_bound_estimate(rows, max_seq_len, TARGET_SHAPE.hidden_size, n_layers, dtype, hs["format"])
        source = f"before tokenization: {rows:,} training prompts x tokenize.max_seq_len {max_seq_len}"
    # the online mode's working set where the schema has hidden_states.mode
    total_seq_len = config["train"]["total_seq_len"] if "mode" in hs else None
    for line in plan_lines(est, mode=mode, total_seq_len=total_seq_len, source=source,
                           release_after_training=RELEASE_SHARDS):  # fmt: skip
        print(f"draftline: {line}", file=sys.stderr)
    if mode == "online":
        return
    limit = hs["max_disk_gb"]
    try:
        exact = limit is not None and not est.get("upper_bound")
        lengths = row_lengths("results/tokenized/dataset") if exact else None
        check_limit(est, limit, lengths=lengths, max_seq_len=config["tokenize"]["max_seq_len"],
                    total_seq_len=total_seq_len)  # fmt: skip
    except DiskLimitError as error:
        if not est.get("upper_bound"):
            raise WorkflowError(str(error)) from None
        print(f"draftline: warning: the hidden states may exceed hidden_states.max_disk_gb = {limit} (an upper "
              "bound before tokenization; checked exactly after tokenization, before any extraction)",
              file=sys.stderr)  # fmt: skip


_hidden_state_disk_use()


# What a preflight's rates were measured under (results/preflight/report.json records it): the
# sizing takes them in place of its assumed rates for this same plan only.
PREFLIGHT_PLAN = dict(
    target=TARGET_IDENTITY,
    engine=RESOLVED["engine"],
    parallel=vllm_parallel(),
    versions=versions("vllm", "torch", "transformers"),
    vllm=config["vllm"],  # memory share, batch size, expert parallel...: they change the rates
)


def _sizing():
    """Before the first job: GPU-hours per stage and hidden-state bytes for this config, from the
    prompt count and the configured lengths (draftline.sizing, docs/sizing.md), with the rates
    the preflight measured for this plan where it ran (results/preflight/report.json)."""
    from draftline.artifacts.preflight import REPORT, measured_rates
    from draftline.sizing import for_config

    if workflow.remote_exec or Path("results/checkpoint/final").exists():
        return
    measured = measured_rates(REPORT, PREFLIGHT_PLAN)
    text = for_config(config, TARGET.kind, TARGET.config_folder, DEVICE, _train_gpus(), _planned_rows(), measured,
                      TARGET.name)
    print(f"draftline: {text}", file=sys.stderr)


_sizing()
