"""Where this run's jobs go, decided when the workflow is parsed: on the machine that plans it,
or on a cluster's nodes (Slurm, or any other non-local Snakemake executor).

The device a plan is for follows from it. On a cluster the machine that plans (a login node)
says nothing about the nodes the jobs land on, so `device: auto` means cuda there whatever the
login node has, and a plan for CPU needs two settings (`device: cpu` and `cpu_on_cluster: true`):
one `device: cpu` left in a copied config would otherwise price and run a GPU recipe on CPUs.

The executor is read from the command snakemake was started with (`--executor`, or a profile's
`executor:`): Snakemake 9.27 parses the Snakefile before it hands the executor to the workflow,
and a dry run's workflow holds the `dryrun` executor, not the one the run will use. So nothing a
user adds (`--config`, `--configfile`, `--set-resources`) can switch a cluster plan to CPU by
accident, which a profile's `config: [device=cuda]` could not promise: a `--config` on the
command line replaces a profile's `config:` list as a whole. Inside a cluster job (Snakemake's
remote mode) the same decision is made again from the same config, so the job's params are the
plan's.
"""

from __future__ import annotations

import sys

from draftline.planning.rule_params import PlanError, planned_device


def snakemake_executor() -> str | None:
    """The executor the running `snakemake` command was started with (`--executor` or a profile's
    `executor:`, e.g. "slurm"; "local" when none), None outside Snakemake's command line (its
    Python API). Read from the command line's parsed arguments, which Snakemake's own
    `args_to_api` holds while it parses the Snakefile."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "args_to_api" and frame.f_globals.get("__name__") == "snakemake.cli":
            executor = getattr(frame.f_locals.get("args"), "executor", None)
            return str(executor) if executor else None
        frame = frame.f_back
    return None


def jobs_leave_this_machine(executor: str | None) -> bool:
    """Whether `executor` runs jobs elsewhere (a cluster or cloud plugin); local, dryrun and
    touch run them here. An executor whose plugin is not installed or fails to load stops the plan
    (PlanError naming the executor, its package and what failed): counted as local, it would plan
    a cluster run for this machine's device."""
    if executor in (None, "local", "dryrun", "touch"):
        return False
    package = f"snakemake-executor-plugin-{executor}"
    try:
        from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

        registry = ExecutorPluginRegistry()
        if not registry.is_installed(executor):
            raise PlanError(
                f"executor {executor!r}: {package} is not installed in this environment (installed executors: "
                f"{', '.join(sorted(registry.get_registered_plugins()))}); install it, or name another executor"
            )
        plugin = registry.get_plugin(executor)
        return not plugin.common_settings.local_exec
    except PlanError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of a third-party plugin's import
        raise PlanError(
            f"executor {executor!r}: its plugin ({package}) failed to load: {type(error).__name__}: {error}. "
            "Fix or reinstall the plugin (`./draftline python -c 'import snakemake_executor_plugin_"
            f"{executor.replace('-', '_')}'` shows the full error)"
        ) from error


def cluster_device(setting: str, on_cluster: bool, cpu_on_cluster: bool, executor: str | None) -> str:
    """The device the plan is for. Off a cluster: `planned_device` (auto = this machine's GPU).
    On a cluster: auto and cuda plan cuda; cpu only with cpu_on_cluster, else PlanError saying
    how to mean it."""
    if not on_cluster:
        return planned_device(setting)
    if setting in ("auto", "cuda"):
        return "cuda"
    if setting == "cpu" and cpu_on_cluster:
        return "cpu"
    if setting == "cpu":
        name = executor or "a cluster"
        raise PlanError(
            f"device: cpu with the {name} executor: every job would run on the CPU of a cluster node "
            "(float32, AdamW, no loader workers, the CPU build of vLLM and torch), not on its GPUs. "
            "On a GPU cluster remove `device` from the config "
            "(auto plans cuda when the jobs run on a cluster's nodes) or set device: cuda. To compute "
            "on the nodes' CPUs on purpose, say so twice: --config device=cpu cpu_on_cluster=True "
            "(or both keys in the config file)"
        )
    return planned_device(setting)  # an unknown value: its own message
