"""The plan's sizing estimate (`for_config`) and how an estimate reads as text (`describe`): a
headline, a small table of the stages' time and lines of what it assumed, each line short enough
to read in a terminal (the plan prints each after `draftline: `)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from draftline.planning.sizing.estimate import EXPECTED_SHARE, LOAD_BYTES_PER_S, gpu_groups
from draftline.planning.sizing.inputs import config_estimate
from draftline.planning.sizing.shapes import SMOLLM2_135M, shape_of


@dataclass(frozen=True)
class SizedTarget:
    """What sizing reads of the target: its kind (local, hub, embedded), the folder holding its
    config.json, and the name the line gives it (else the folder's name, which for a cached hub
    snapshot is a commit)."""

    kind: str
    dir: str | Path
    name: str | None = None


def for_config(config: dict, target: SizedTarget, device: str, train_gpus: int,
               planned: tuple[int | None, str | None],
               measured: tuple[dict | None, str] = (None, "no preflight report"), user_turns: int | None = None) -> str:
    """The plan's estimate for `planned` (planned_training_rows: lines, see describe), or a line saying what
    it waits for: the target's config.json (a hub model still to download) or the count of
    training conversations (a source that cannot be counted cheaply, without prompts.max_samples).
    `measured` is `artifacts.preflight.measured_rates`' answer: the preflight's rates (and where
    from), or None and why there are none; the line says which rates it used."""
    target_dir = target.dir
    config_json = Path(target_dir) / "config.json"
    if config_json.is_file():
        shape = shape_of(config_json, target.name)
    elif target.kind == "embedded":
        shape = SMOLLM2_135M
    else:
        return (f"no sizing estimate before the first job: the target's config.json is not in {target_dir} "
                "yet (the target_model job downloads it; the next dry run prints the estimate)")
    conversations, why_not = planned
    if conversations is None:
        return f"no sizing estimate before the first job: {why_not}"
    if not conversations:
        return "no sizing estimate: no training conversations are left after the held-out prompts"
    rates, source = measured
    if rates is not None:
        rates = {**rates, "source": source}
    lines = [describe(config_estimate(shape, config, conversations, train_gpus, device, rates, user_turns))]
    if rates is None and device == "cuda":
        # each other GPU kind's total, where its rates differ (the H200's group is the table's)
        for group in gpu_groups():
            if "H200" not in group.kinds:
                est = config_estimate(shape, config, conversations, train_gpus, device, user_turns=user_turns,
                                      gpu=group.kinds[0])
                lines.append(_wrapped(f"on {group.label}: total {_hours(sum(est['device_hours'].values()))} "
                                      f"({group.basis})"))
    if rates is None:
        lines.append(_wrapped(f"no preflight rates ({source}): `preflight` measures this plan's on its GPUs "
                              "(docs/cluster.md)"))
    if shape.experts and device == "cuda":
        on = (config.get("vllm") or {}).get("enable_expert_parallel")
        lines.append(_wrapped(f"MoE with expert parallelism {'on' if on else 'off'} (vllm.enable_expert_parallel), "
                              "which the assumed rates do not model (docs/cluster.md)"))
    return "\n".join(lines)


# Each line of the estimate after the headline fits this width (after the plan's `draftline: `).
WIDTH = 100


def _wrapped(text: str) -> str:
    """A line of the estimate under its headline: indented, long ones wrapped to WIDTH."""
    return textwrap.fill(text, WIDTH, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False,
                         break_long_words=False)


def _hours(h: float) -> str:
    return f"{h * 3600:.0f} s" if h < 1 / 30 else f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def describe(est: dict) -> str:
    """The estimate as a few lines: the headline (what is sized, the answers regenerated), a table
    of each stage's device and wall time with their totals (the bound), the figure to plan by, then
    the hidden states' bytes and I/O, the vLLM jobs' start and where the rates come from."""
    unit = "GPU" if est["device"] == "cuda" else "CPU-core"
    kind = ""
    if est["device"] == "cuda" and not est["basis"].startswith("measured"):
        kind = " on " + next(g.label for g in gpu_groups() if est["gpu"] in g.kinds)  # and the kinds alike
    if est["user_turns"] is None:
        turns = "regeneration: one answer per conversation until the prompts job counts the user turns"
    else:
        turns = f"regeneration: {est['user_turns']:,} user turns answered"
    headline = (f"sizing for {est['target']} on {est['device']}: {est['conversations']:,} training conversations x "
                f"<= {est['tokens'] // max(est['conversations'], 1):,} tokens = <= {est['tokens']:,} tokens")
    rows = [(stage, _hours(hours), _hours(est["wall_hours"][stage])) for stage, hours in est["device_hours"].items() if hours]
    rows.append(("total (a bound)", _hours(sum(est["device_hours"].values())), _hours(sum(est["wall_hours"].values()))))
    header = (f"{unit} time per stage{kind}", f"{unit} time", "wall")
    width = [max(len(header[0]) - 2, *(len(row[0]) for row in rows)),
             *(max(len(row[i]) for row in [header, *rows]) for i in (1, 2))]
    table = [f"  {header[0]:<{width[0] + 2}}  {header[1]:>{width[1]}}  {header[2]:>{width[2]}}"]
    table += [f"    {name:<{width[0]}}  {device:>{width[1]}}  {wall:>{width[2]}}" for name, device, wall in rows]
    return "\n".join([
        headline, _wrapped(turns), *table, _wrapped(_expected(est)),
        _wrapped(f"hidden states <= {_bytes(est['hidden_state_bytes'])} ({est['bytes_per_token']:,} B/token){_io(est)}"),
        _wrapped(_load(est)),
        _wrapped(f"upper bounds from the configured lengths; {est['basis']} (docs/sizing.md)"),
    ])


def _expected(est: dict) -> str:
    """The figure to plan by: each stage's bound x the share of it the embedded default took."""
    device = sum(v * EXPECTED_SHARE[k] for k, v in est["device_hours"].items())
    wall = sum(v * EXPECTED_SHARE[k] for k, v in est["wall_hours"].items())
    return (f"expected about {_hours(device)}, {_hours(wall)} wall, for data that fill the lengths as the "
            "embedded default's do (EXPECTED_SHARE)")


def _load(est: dict) -> str:
    """Each vLLM job's start: the engine's, measured (VLLM_START_S), and the weights' load at the
    filesystem's rate (or the local disk's)."""
    start = est["vllm_start_seconds"]
    if est["vllm_start_measured"]:
        return f"each vLLM job starts in {_hours(start / 3600)} (measured by the preflight)"
    rate = est.get("filesystem_bytes_per_s") or LOAD_BYTES_PER_S
    source = "sizing.filesystem_gb_per_s" if est.get("filesystem_bytes_per_s") else "LOAD_BYTES_PER_S"
    return (f"each vLLM job starts in {_hours(start / 3600)} (included above): the weights "
            f"({_bytes(est['weights_bytes'])}) load at {rate / 1e9:g} GB/s ({source}), beside "
            f"{est['vllm_engine_seconds']:.0f} s of the engine's own start (VLLM_START_S: measured, less its weights' load)")


def _io(est: dict) -> str:
    rate = est.get("filesystem_bytes_per_s")
    if not rate:
        return ""
    parts = ", ".join(f"{k} {_hours(v)}" for k, v in est["io_hours"].items())
    if not parts:
        return ""
    return (f"; at {rate / 1e9:g} GB/s (sizing.filesystem_gb_per_s; set it to your filesystem's rate): "
            f"hidden-state I/O {parts} (included above)")
