"""The plan's one-line sizing estimate (`for_config`) and how an estimate reads as text (`describe`)."""

from __future__ import annotations

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
    """The plan's one-line estimate for `planned` (planned_training_rows), or a line saying what
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
    text = describe(config_estimate(shape, config, conversations, train_gpus, device, rates, user_turns))
    if rates is None and device == "cuda":
        # each other GPU kind's total, where its rates differ (the H200's group is the line's)
        for group in gpu_groups():
            if "H200" not in group.kinds:
                est = config_estimate(shape, config, conversations, train_gpus, device, user_turns=user_turns,
                                      gpu=group.kinds[0])
                text += f"; on {group.label} total {_hours(sum(est['device_hours'].values()))} ({group.basis})"
    if rates is None:
        text += f"; no preflight rates ({source}): `preflight` measures this plan's on its GPUs (docs/cluster.md)"
    if shape.experts and device == "cuda":
        on = (config.get("vllm") or {}).get("enable_expert_parallel")
        text += (f"; MoE with expert parallelism {'on' if on else 'off'} (vllm.enable_expert_parallel), which the "
                 "assumed rates do not model (docs/cluster.md)")
    return text


def _hours(h: float) -> str:
    return f"{h * 3600:.0f} s" if h < 1 / 30 else f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def describe(est: dict) -> str:
    unit = "GPU" if est["device"] == "cuda" else "CPU-core"
    stages = ", ".join(
        f"{k} {_hours(v)} ({_hours(est['wall_hours'][k])} wall)" for k, v in est["device_hours"].items() if v
    )
    kind = ""
    if est["device"] == "cuda" and not est["basis"].startswith("measured"):
        kind = " on " + next(g.label for g in gpu_groups() if est["gpu"] in g.kinds)  # and the kinds alike
    if est["user_turns"] is None:
        turns = "; regeneration: one answer per conversation until the prompts job counts the user turns"
    else:
        turns = f"; regeneration: {est['user_turns']:,} user turns answered"
    return (
        f"sizing for {est['target']} on {est['device']}: {est['conversations']:,} training conversations x "
        f"<= {est['tokens'] // max(est['conversations'], 1):,} tokens = <= {est['tokens']:,} tokens{turns}; {unit} time per "
        f"stage{kind}: "
        f"{stages}; total {_hours(sum(est['device_hours'].values()))} (a bound; {_expected(est)}); hidden states <= "
        f"{_bytes(est['hidden_state_bytes'])} ({est['bytes_per_token']:,} B/token){_io(est)}{_load(est)}. Upper bounds from the "
        f"configured lengths; {est['basis']} (docs/sizing.md)"
    )


def _expected(est: dict) -> str:
    """The figure to plan by: each stage's bound x the share of it the embedded default took."""
    device = sum(v * EXPECTED_SHARE[k] for k, v in est["device_hours"].items())
    wall = sum(v * EXPECTED_SHARE[k] for k, v in est["wall_hours"].items())
    return (f"expected about {_hours(device)}, {_hours(wall)} wall, for data that fill the lengths as the "
            "embedded default's do: EXPECTED_SHARE")


def _load(est: dict) -> str:
    """Each vLLM job's start: the engine's, measured (VLLM_START_S), and the weights' load at the
    filesystem's rate (or the local disk's)."""
    start = est["vllm_start_seconds"]
    if est["vllm_start_measured"]:
        return f"; each vLLM job starts in {_hours(start / 3600)} (measured by the preflight)"
    rate = est.get("filesystem_bytes_per_s") or LOAD_BYTES_PER_S
    source = "sizing.filesystem_gb_per_s" if est.get("filesystem_bytes_per_s") else "LOAD_BYTES_PER_S"
    return (f"; each vLLM job starts in {_hours(start / 3600)} (included above): the weights "
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
