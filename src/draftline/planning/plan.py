"""The run's plan, decided once at parse time before any job starts (rules/common.smk calls `plan`).

From the validated config and the machine that plans: the config's paths and prompt sources
checked, the target resolved and identified by content (hashes kept across run folders,
draftline.lineage.target_hash_cache), the device and the `auto` settings resolved for it
(draftline.planning.rule_params.resolved_settings), the config checked against the target's shape
(draftline.planning.config_checks), the hidden states' disk use printed and held to hidden_states.max_disk_gb
(draftline.stages.disk_estimate), and the run's GPU-hours printed (draftline.planning.sizing). What it prints and the
errors it raises (PlanningError, which the workflow shows as a WorkflowError) are what a user
sees before the first job.

Relative paths are the working folder's, as in every job: snakemake runs in it (--directory).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from draftline.artifacts import layer_ids as layer_ids_file
from draftline.artifacts.hidden_states import manifest_format, read_manifest
from draftline.fidelity import FidelitySettings, resolve_min_top1
from draftline.lineage.target_hash_cache import RUN_FILE, SharedHashCache, local_target_files
from draftline.planning.cluster import cluster_device, jobs_leave_this_machine, snakemake_executor
from draftline.planning.config_checks import ConfigError, TargetShape, check_config, config_notes, target_shape
from draftline.planning.config_files import PlanningError, check_prompt_sources, check_relative_paths
from draftline.planning.rule_params import VLLM_DIST, DeviceSetting, PlanError, pinned_versions, resolved_settings
from draftline.planning.sizing import planned_train_gpus, planned_training_rows
from draftline.runtime.vllm_engine import EngineSettings, EngineSettingsError, engine_settings, output_settings
from draftline.settings import DraftlineConfig
from draftline.stages.disk_estimate import (
    DiskLimit,
    DiskLimitError,
    check_limit,
    parse_time_estimate,
    plan_lines,
    row_lengths,
    upper_bound_estimate,
)
from draftline.stages.summary import SummarySettings
from draftline.stages.target_model import TargetSpec, resolve_target, target_identity
from draftline.stages.train.settings import HiddenStateSource

HASH_CACHE = RUN_FILE
PROMPTS_SUMMARY = "results/prompts/summary.json"
TOKENIZED_SUMMARY = "results/tokenized/summary.json"
TOKENIZED_DATASET = "results/tokenized/dataset"
LAYER_IDS = "results/target/layer_ids.json"
FINAL_CHECKPOINT = "results/checkpoint/final"
# The rules that load the target in vLLM: each asks for one GPU per rank itself.
VLLM_RULES = ("regenerate_shard", "hidden_states_shard", "evaluate_set", "evaluate_sets", "evaluate_baseline",
              "preflight_environment",
              "preflight_regenerate",
              "preflight_hidden_states", "preflight_speculative")


HELDOUT_SPLIT = (
    "prompts.heldout was split into prompts.validation (choose settings on it) and "
    "prompts.test (report it, never tune on it); replace the key in your config"
)
# Snakemake's `code` trigger would rerun every step after a fresh clone; the profiles switch it off.
CODE_TRIGGER_ON = (
    "warning: Snakemake's `code` rerun trigger is on (no draftline profile "
    "loaded?): after a fresh clone every step reruns for its scripts' new mtimes. Add "
    "`--rerun-triggers mtime params input software-env` (profiles/default sets it)."
)


# Snakemake's commands that run no job (they read or clear its metadata): a refusal that is about
# where jobs would run (the device, expert parallelism on CPU, a shape check) must not stop them,
# so `./draftline snakemake --unlock` works in a run folder without the profile it was planned with.
NO_JOB_FLAGS = ("--unlock", "--cleanup-metadata", "--cm", "--list-changes", "--lc", "--list-input-changes",
                "--li", "--list-params-changes", "--lp", "--list-untracked", "--lu", "--cleanup-shadow")


def no_job_command(argv: list[str]) -> str | None:
    """The flag of a Snakemake command in `argv` that runs no job (NO_JOB_FLAGS), else None."""
    return next((arg.split("=", 1)[0] for arg in argv if arg.split("=", 1)[0] in NO_JOB_FLAGS), None)


@dataclass(frozen=True)
class Plan:
    target: TargetSpec
    target_identity: dict  # the target's content: the `target` param of every rule that reads it
    verifier_name: str  # what the published draft names as its verifier: never a local path
    executor: str | None
    on_cluster: bool  # the jobs run on a cluster executor's nodes, not here
    device: str
    device_setting: DeviceSetting  # the config's `device` as written (auto, cpu, cuda)
    resolved: dict  # the `auto` settings for the device, per concern (draftline.planning.rule_params.resolved_settings)
    default_train_gpus: int  # the train rule's `gpu`: the Trainer's, plus the online server's
    train_gpus: int  # what it asks for with the profile's (or --set-resources') setting
    vllm_ranks: int  # target.tensor_parallel_size x pipeline_parallel_size
    vllm_parallel: dict
    shards: tuple[int, ...]
    target_shape: TargetShape | None
    fidelity: FidelitySettings
    preflight_plan: dict  # what a preflight's rates were measured under
    engine: EngineSettings  # the one vLLM engine settings object every vLLM job and the online server get
    # Stages' settings objects with what no param compares (each a param Snakemake skips):
    disk_limit: DiskLimit  # hidden_states.max_disk_gb, held to by the disk estimate's job
    hidden_state_source: HiddenStateSource  # where training's hidden states come from
    summary: SummarySettings  # the run's name and what the summary page names

    @property
    def target_dir(self) -> str:
        return str(self.target.dir)

    def vllm_engine(self, without: tuple[str, ...] = ()) -> dict:
        """The params every vLLM job gets: `engine`, the EngineSettings its script hands on as it is
        (an object, which Snakemake skips: speed-only settings rerun nothing), `engine_outputs`, its
        fields that can change outputs (plain values that decide staleness; `without` those the stage
        does not use), and `planned`: device and dtype (a job elsewhere stops)."""
        return dict(
            engine=self.engine,
            engine_outputs=output_settings(self.engine, without),
            planned={k: v for k, v in self.resolved["engine"].items() if k != "enforce_eager"},
        )

    def extraction_parallel(self, backend: str) -> dict:
        """The target's split as the hidden-state job's param: the vllm backend's float sums follow it
        (a change reruns extraction); the transformers backend ignores it."""
        return dict(self.vllm_parallel) if backend == "vllm" else {}

    def hidden_state_params(self) -> dict:
        """The train rule's params for where its hidden states come from: `source`, the
        HiddenStateSource its script hands on, which Snakemake does not compare (the online server's
        start-up wait, the samples the Trainer may skip, the fidelity bar and speed-only vLLM settings
        change no published checkpoint), and `hidden_states`, its fields that can change the draft."""
        return dict(source=self.hidden_state_source, hidden_states=self.hidden_state_source.outputs())


def say(line: str) -> None:
    print(f"draftline: {line}", file=sys.stderr)


def plan(config: dict, *, workdir: str | Path, repo: str | Path, executor: str | None, remote_exec: bool,
         gpu_overrides: dict[str, int | str | None], no_job: str | None = None) -> Plan:
    """The plan for `config` (validated, defaults filled), printing what a user sees before the first
    job. `gpu_overrides`: {rule: the `gpu` a profile or --set-resources sets, None when unset, the
    text of an expression only the job knows}. `no_job`: the flag of a command that runs no job
    (no_job_command): the device's refusals are notes then, not stops. Sets config["run_name"] and
    sorts the config's keys in place: a dict param is compared by its repr, so reordering
    config.yaml never reruns a job."""
    workdir, repo = Path(workdir), Path(repo)
    sets = config["evaluate"]["prompt_sets"]  # `name: null` in a later config file leaves a set out
    config["evaluate"]["prompt_sets"] = {name: path for name, path in sets.items() if path is not None}
    check_relative_paths(config, workdir, repo)
    check_prompt_sources(config)
    target, identity = _resolve_target(config, workdir)
    try:
        on_cluster = remote_exec or jobs_leave_this_machine(executor)
        device = cluster_device(config["device"], on_cluster, config["cpu_on_cluster"], executor)
    except PlanError as error:
        _refuse(str(error), no_job)
        device = "cpu" if config["device"] == "cpu" else "cuda"
    hs = config["hidden_states"]
    default_train_gpus, train_gpus = planned_train_gpus(config, gpu_overrides)
    resolved = resolved_settings(config, device, train_gpus)
    if not remote_exec:
        say(planned_line(config, device, resolved, executor if on_cluster else None))
    vllm_ranks = DraftlineConfig.read(config).target.vllm_ranks
    check_gpu_overrides(gpu_overrides, vllm_ranks)
    config["run_name"] = config["run_name"] or workdir.name  # the report's and summary's title; compared by no param
    # the target as the summary names it (SmolLM2-135M-Instruct, not "embedded"), for the report's
    # title (report/workflow.rst reads only the config); the name it resolves to, so nothing changes
    config["target"]["name"] = target.name
    for key in sorted(config):
        config[key] = sort_keys(config.pop(key))
    try:
        shape = target_shape(target.kind, target.config_folder)
    except ConfigError as error:
        raise PlanningError(str(error)) from None
    try:
        check_config(config, shape, device)
    except ConfigError as error:
        _refuse(str(error), no_job)
    versions = pinned_versions(repo, device, ("vllm", "torch", "transformers"))
    for line in [] if remote_exec else config_notes(config, device, versions[VLLM_DIST[device]],
                                                     extracted_layers(hs["layer_ids"]) - 1):
        say(line)
    typed = DraftlineConfig.read(config)  # the stages' settings objects are built from its blocks
    parallel = {key: config["target"][key] for key in ("pipeline_parallel_size", "tensor_parallel_size")}
    try:  # the `vllm:` block, target.* and the resolved engine settings, once
        engine = engine_settings(typed, resolved["engine"])
    except EngineSettingsError as error:
        _refuse(str(error), no_job)  # a device refusal (a wrong engine_args key raises again below)
        try:
            engine = engine_settings(typed, {**resolved["engine"], "device": None})
        except EngineSettingsError as again:
            raise PlanningError(str(again)) from None
    fidelity = fidelity_settings(typed)
    the_plan = Plan(
        target=target, target_identity=identity,
        verifier_name=config["target"]["verifier_name"] or (target.source if target.kind == "hub" else target.name),
        executor=executor, on_cluster=on_cluster, device=device, device_setting=DeviceSetting(config["device"]),
        resolved=resolved, default_train_gpus=default_train_gpus, train_gpus=train_gpus, vllm_ranks=vllm_ranks,
        vllm_parallel=parallel, shards=tuple(range(hs["shards"])), target_shape=shape, fidelity=fidelity,
        preflight_plan=dict(target=identity, engine=resolved["engine"], parallel=parallel,
                            versions=versions,
                            vllm=config["vllm"]),  # memory share, batch size, expert parallel...: they change the rates
        engine=engine, disk_limit=DiskLimit.from_config(typed),
        hidden_state_source=HiddenStateSource.from_config(typed, dtype=resolved["engine"]["dtype"], engine=engine,
                                                          fidelity=fidelity),
        summary=SummarySettings(run_name=config["run_name"], target=target.name, device=device),
    )
    planned_rows = functools.cache(lambda: planned_training_rows(config, PROMPTS_SUMMARY))  # counted once
    if no_job:
        return the_plan  # no disk plan or sizing for a command that runs nothing
    hidden_state_disk_use(config, the_plan, planned_rows)
    if not remote_exec and not Path(FINAL_CHECKPOINT).exists():
        for line in sizing_line(config, the_plan, planned_rows()).splitlines():
            say(line)
    return the_plan


def planned(config: dict, workflow, argv: list[str]) -> Plan:
    """The plan as rules/common.smk asks for it, from Snakemake's `workflow` (its folder, executor,
    and the `gpu` a profile or --set-resources sets per rule, passed as plain values) and the
    command line `argv`; a PlanningError becomes Snakemake's WorkflowError."""
    from snakemake.exceptions import WorkflowError

    from draftline.planning.sizing import gpu_overrides

    overrides = workflow.resource_settings.overwrite_resources or {}
    gpus = {step: overrides.get(step, {}).get("gpu") for step in ("train", *VLLM_RULES)}
    try:
        return plan(config, workdir=Path.cwd(), repo=Path(workflow.basedir), executor=snakemake_executor(),
                    remote_exec=workflow.remote_exec, gpu_overrides=gpu_overrides(gpus), no_job=no_job_command(argv))
    except PlanningError as error:
        raise WorkflowError(str(error)) from None


def _refuse(message: str, no_job: str | None) -> None:
    """Stop the plan with `message`, or for a command that runs no job say it and go on."""
    if no_job is None:
        raise PlanningError(message)
    say(f"note: {message} (not a stop for {no_job}, which runs no job)")


# ---------------------------------------------------------------- target, device, resources


def _resolve_target(config: dict, workdir: Path) -> tuple[TargetSpec, dict]:
    """The target and its identity. A local target's files are hashed once per file version, with a
    progress line when that is big, and the hashes kept for every run folder of the user."""
    block = config["target"]
    target = resolve_target(block["model"], name=block["name"], chat_template=block["chat_template"],
                            repo_root=workdir, revision=block["revision"])
    cache = SharedHashCache(HASH_CACHE)
    local = local_target_files(target, workdir)
    if local is not None:
        cache.hash_ahead(local[1], f"the target folder {local[0]}", say)
    identity = target_identity(target, workdir, cache)
    cache.save()
    return target, identity


def planned_line(config: dict, device: str, resolved: dict, cluster_executor: str | None) -> str:
    """The device and the settings resolved for it, as the plan prints them."""
    where = f"; the jobs run on the {cluster_executor} executor's nodes" if cluster_executor else ""
    settings = sorted({**resolved["engine"], **resolved["train"]}.items())
    return f"planned for {device} (device: {config['device']}{where}): " + ", ".join(
        f"{k} {v}" for k, v in settings if k != "device"
    )


def check_gpu_overrides(gpu_overrides: dict, vllm_ranks: int) -> None:
    """A rule that loads the target in vLLM asks for one GPU per rank itself; a profile must not."""
    for step in VLLM_RULES:
        gpus = gpu_overrides.get(step)
        if gpus not in (None, vllm_ranks):
            raise PlanningError(
                f"the profile (or --set-resources) gives rule {step} gpu={gpus}, but vLLM splits "
                f"the target over target.tensor_parallel_size x pipeline_parallel_size = {vllm_ranks} GPUs and "
                f"the rule asks for that many itself; remove `gpu` under {step} in the profile"
            )


def sort_keys(value):
    if isinstance(value, dict):
        return {k: sort_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sort_keys(v) for v in value]
    return value


def fidelity_settings(config: DraftlineConfig) -> FidelitySettings:
    """hidden_states.fidelity with its `auto` bar resolved for where the answers come from: a param
    that decides no staleness (a FidelitySettings object: Snakemake compares only plain values), as
    the bar gates a shard's publishing, it is not what the states are; so a new bar reruns no
    published shard, and a shard that failed reruns under it reusing its staged files."""
    block = config.hidden_states.fidelity
    bar, basis = resolve_min_top1(block.min_top1, config.regenerate.enabled, config.regenerate.temperature)
    return FidelitySettings(rows=block.rows, min_top1=bar, basis=basis, recompute_rows=block.recompute_rows)


# ---------------------------------------------------------------- disk use and sizing


def _shards_done(config: dict, shards: tuple[int, ...]) -> bool:
    """Every shard extracted, in the configured format (a shard without a readable manifest: the
    job decides)."""

    def same_format(folder: Path) -> bool:
        try:
            return manifest_format(read_manifest(folder)) == config["hidden_states"]["format"]
        except (OSError, ValueError):
            return True

    folders = [Path(f"results/hidden_states/shard_{shard}") for shard in shards]
    return all(folder.exists() and same_format(folder) for folder in folders)


def extracted_layers(setting) -> int:
    """How many layers extraction captures: results/target/layer_ids.json's once the layer_ids rule
    ran, else as configured (`auto`: speculators' three aux layers, draftline.stages.layer_ids, + the last)."""
    try:
        return len(layer_ids_file.read(LAYER_IDS).extracted)
    except ValueError:  # not yet (or not readable)
        return (3 if setting == "auto" else len(setting)) + 1


def hidden_state_disk_use(config: dict, plan: Plan, planned_rows) -> None:
    """While shards are still to extract (or in another format): print each stage's expected disk
    use for the chosen format and mode (from the tokenized summary, or before tokenization an
    upper bound from the prompt count x tokenize.max_seq_len) and hold an offline run to
    hidden_states.max_disk_gb, which may have changed since the rule ran (plan.disk_limit, a param
    Snakemake does not compare: changing it re-extracts nothing). `planned_rows()`:
    sizing.planned_training_rows."""
    hs, disk = config["hidden_states"], plan.disk_limit
    mode = hs["mode"]  # online: no shard files
    if (mode != "online" and _shards_done(config, plan.shards)) or plan.target_shape is None:
        return
    hidden, n_layers, dtype = plan.target_shape.hidden_size, extracted_layers(hs["layer_ids"]), plan.resolved["engine"]["dtype"]
    max_seq_len = disk.max_seq_len
    est = parse_time_estimate(TOKENIZED_SUMMARY, hidden, n_layers, dtype, hs["format"])
    source = f"from {TOKENIZED_SUMMARY}"
    if est is None:
        rows = planned_rows()[0]
        if rows is None:
            return
        est = upper_bound_estimate(rows, max_seq_len, hidden, n_layers, dtype, hs["format"])
        source = f"before tokenization: {rows:,} training prompts x tokenize.max_seq_len {max_seq_len}"
    for line in plan_lines(est, mode=mode, total_seq_len=disk.total_seq_len, source=source,
                           release_after_training=hs["release_after_training"]):
        say(line)
    if mode == "online":
        return
    limit = disk.max_disk_gb
    try:
        lengths = row_lengths(TOKENIZED_DATASET) if limit is not None and not est.get("upper_bound") else None
        check_limit(est, limit, lengths=lengths, max_seq_len=max_seq_len, total_seq_len=disk.total_seq_len)
    except DiskLimitError as error:
        if not est.get("upper_bound"):
            raise PlanningError(str(error)) from None
        say(f"warning: the hidden states may exceed hidden_states.max_disk_gb = {limit} (an upper "
            "bound before tokenization; checked exactly after tokenization, before any extraction)")


def sizing_line(config: dict, plan: Plan, planned_rows: tuple[int | None, str | None]) -> str:
    """GPU-hours per stage and hidden-state bytes for this config, from the prompt count and the
    configured lengths (draftline.planning.sizing, docs/sizing.md), with the rates the preflight measured
    for this plan where it ran (results/preflight/report.json)."""
    from draftline.artifacts.preflight import REPORT, measured_rates
    from draftline.planning.sizing import SizedTarget, for_config, planned_user_turns

    measured = measured_rates(REPORT, plan.preflight_plan)
    target = SizedTarget(plan.target.kind, plan.target.config_folder, plan.target.name)
    return for_config(config, target, plan.device, plan.train_gpus, planned_rows, measured, planned_user_turns(PROMPTS_SUMMARY))
