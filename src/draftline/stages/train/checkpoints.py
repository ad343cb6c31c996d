"""A run's folder and its checkpoints: `runs/<run key>/`, where the key hashes the settings that
change the training trajectory and a fingerprint of every input, so a retry with the same
inputs resumes there (speculators' own resume) and a changed one starts afresh; the epoch and
step checkpoints speculators saves in it, those a kill cut short, and earlier runs' folders."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from draftline.lineage.content_hash import digest, fingerprint
from draftline.lineage.target_hash_cache import job_cache
from draftline.stages.train.args import TrainerOptions
from draftline.stages.train.settings import TrainInputs, TrainSettings

log = logging.getLogger(__name__)

# Files of an epoch folder that final/ needs; training_state.json is written last by
# speculators, so an epoch folder without it was cut short by a kill. Its `local_step` is 0 for
# an epoch's end, N > 0 for a checkpoint after step N of that epoch (train.checkpoint_freq < 1).
EPOCH_COMPLETE_MARKER = "training_state.json"
FINAL_FILES = ("config.json", "model.safetensors")
RESUME_FILES = (*FINAL_FILES, "optimizer_state_dict.pt")
# What speculators saves when SIGTERM/SIGINT interrupts it: no training state (step) is recorded,
# so it cannot be resumed exactly; draftline resumes from the last epoch or step checkpoint.
INTERRUPTED = "interrupted"
# Settings that do not change the training trajectory: a retry after changing them resumes.
NOT_IN_RUN_KEY = ("num_workers", "keep_old_runs", "checkpoint_freq")
RUN_RECORD = "draftline_run.json"  # marks a folder this module made (and only those are pruned)


@dataclass(frozen=True)
class Run:
    key: str
    dir: Path
    fingerprints: dict[str, str]  # input_fingerprints

    @property
    def metrics_path(self) -> Path:
        return self.dir / "metrics.jsonl"  # train.entry appends speculators' metrics here


def input_fingerprints(inputs: TrainInputs, server: dict | None = None) -> dict[str, str]:
    """Each input's `content_hash.fingerprint`: content, the target's big files through the hash
    cache the plan filled (read again only when a file changed, in place too); the hidden states by
    stat (names, sizes, mtimes, ctimes: the workflow wrote them). In online mode the server's
    settings stand for the hidden states (the target is already here)."""
    hidden = (
        hashlib.sha256(json.dumps({"online": server}, sort_keys=True).encode()).hexdigest() if server is not None
        else digest(fingerprint(inputs.hidden_states, limit=0))
    )
    return {
        "config": digest(fingerprint(Path(inputs.config_dir) / "config.json")),
        "d2t": digest(fingerprint(inputs.d2t)),
        "t2d": digest(fingerprint(inputs.t2d)),
        "layer_ids": digest(fingerprint(inputs.layer_ids)),
        "dataset": digest(fingerprint(inputs.dataset)),
        "hidden_states": hidden,
        "target": _target_fingerprint(inputs.target, inputs.target_identity),
    }


def _target_fingerprint(target: str, identity: dict | None) -> str:
    if identity is not None:  # what the plan hashed (by content): nothing to read here
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    if not Path(target).exists():
        return str(target)  # a hub id
    cache = job_cache()
    found = digest(fingerprint(target, cache=cache))
    cache.save()
    return found


def run_key(settings: TrainSettings, optimizer: str, world_size: int, fingerprints: dict) -> str:
    trajectory = {k: v for k, v in asdict(settings).items() if k not in NOT_IN_RUN_KEY}
    payload = {
        "settings": {**trajectory, "optimizer": optimizer},
        "world_size": world_size,  # changes the global batch, so the trajectory
        "inputs": fingerprints,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def open_run(runs_dir: Path, inputs: TrainInputs, settings: TrainSettings, options: TrainerOptions,
             world_size: int, server_key: dict | None) -> Run:
    """The run's folder under `runs_dir` (made, with its record), without half-saved checkpoints.
    `server_key`: online, what decides the server's states (they stand for the files)."""
    fingerprints = input_fingerprints(inputs, server_key)
    key = run_key(replace(settings, fsdp=options.fsdp), options.optimizer, world_size, fingerprints)
    run_dir = Path(runs_dir) / key
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_RECORD).write_text(
        json.dumps({"settings": asdict(settings), "optimizer": options.optimizer, "world_size": world_size,
                    "inputs": {k: str(v) for k, v in asdict(inputs).items()},
                    "fingerprints": fingerprints}, indent=1) + "\n"
    )
    discard_incomplete_epochs(run_dir)
    return Run(key, run_dir, fingerprints)


def epoch_dirs(run_dir: Path) -> dict[int, Path]:
    """Complete epoch folders by epoch number (symlinks such as epoch0_end skipped)."""
    found = {}
    if run_dir.is_dir():
        for child in run_dir.iterdir():
            if child.is_dir() and not child.is_symlink() and child.name.isdigit():
                found[int(child.name)] = child
    return dict(sorted(found.items()))


def local_step(folder: Path) -> int | None:
    """The step within its epoch a checkpoint folder was saved after (0 = the epoch's end), None
    without a readable training_state.json."""
    try:
        return int(json.loads((folder / EPOCH_COMPLETE_MARKER).read_text()).get("local_step", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def finished_epochs(run_dir: Path) -> dict[int, Path]:
    """Epoch folders saved at their epoch's end (not a mid-epoch step checkpoint)."""
    return {e: f for e, f in epoch_dirs(run_dir).items() if local_step(f) == 0}


def discard_incomplete_epochs(run_dir: Path) -> None:
    """An epoch folder a kill cut short would make speculators resume from half a checkpoint:
    one without its training_state.json (written last), or whose weights or optimizer state are
    newer than it (a later step checkpoint overwriting the folder was cut short)."""
    for _epoch, folder in epoch_dirs(run_dir).items():
        state = folder / EPOCH_COMPLETE_MARKER
        files = [folder / name for name in RESUME_FILES]
        if local_step(folder) is None or not all(p.exists() for p in files) or any(
            p.stat().st_mtime_ns > state.stat().st_mtime_ns for p in files
        ):
            log.warning("discarding incomplete checkpoint %s (interrupted while saving)", folder)
            shutil.rmtree(folder)
    interrupted = run_dir / INTERRUPTED
    if interrupted.is_dir():
        log.info(
            "removing %s: speculators' save on SIGTERM records no step, so it cannot be resumed "
            "exactly; resuming from the last epoch or step checkpoint instead", interrupted,
        )
        shutil.rmtree(interrupted)


def describe_start(run_dir: Path, epochs: int) -> str:
    """Where a (re)started run begins, epochs counted from 1 as in every draftline log."""
    saved = epoch_dirs(run_dir)
    if not saved:
        return "fresh start"
    last = max(saved)
    step = local_step(saved[last])
    if step:
        return f"resuming in epoch {last + 1} of {epochs} after its step {step} (a step checkpoint)"
    return f"resuming after epoch {last + 1} of {epochs}"


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def prune_old_runs(runs_dir: Path, keep: str) -> list[Path]:
    """Remove the checkpoint folders of earlier settings or inputs (each holds every epoch with
    its optimizer state); only folders this module made (with draftline_run.json) are touched."""
    removed = []
    for folder in sorted(runs_dir.iterdir()):
        if folder.name == keep or not (folder / RUN_RECORD).is_file():
            continue
        size = _size(folder)
        shutil.rmtree(folder)
        log.info("removed the earlier run %s (%.1f MB; train.keep_old_runs: true keeps them)", folder, size / 1e6)
        removed.append(folder)
    return removed
