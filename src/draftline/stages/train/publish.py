"""After the Trainer: the skipped samples checked against what is allowed, the epoch chosen
(best validation loss, or the last one with train_fraction 1.0) and copied to `final/` in one
rename, with the run's records (the verifier named instead of its local path) and provenance."""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from draftline import algorithms
from draftline.artifacts import metrics
from draftline.artifacts.hidden_states import MANIFEST, read_manifest
from draftline.runtime.atomic import atomic_dir, atomic_file
from draftline.stages.train.checkpoints import FINAL_FILES, INTERRUPTED, Run, epoch_dirs, finished_epochs
from draftline.stages.train.inputs import InputFacts
from draftline.stages.train.settings import HiddenStateSource, TrainJob, TrainSettings

log = logging.getLogger(__name__)

SKIPPED_SETTING = "hidden_states.online_max_skipped_samples"


def check_skipped_samples(metrics_path: Path, source: HiddenStateSource, run_dir: Path) -> dict:
    """The samples speculators' Trainer skipped (`metrics.skipped_samples`, counted by
    train.entry.install_skip_counter) with the number allowed (`allowed`); more than allowed stops
    the job before anything is published."""
    skipped = metrics.skipped_samples(metrics_path)
    allowed = source.max_skipped_samples if source.online else 0
    total = skipped["total"]
    where = f"{skipped['training']} in training, {skipped['validation']} in validation"
    if total > allowed:
        setting = SKIPPED_SETTING
        cause = (
            f"the hidden-state server gave none for them after speculators' retries (the Trainer's warnings "
            f"above name each sample; the server's log is {source.server_log})" if source.online
            else "their hidden-state files did not match the dataset"
        )
        raise RuntimeError(
            f"speculators' Trainer skipped {total} sample(s) ({where}; per epoch {skipped['per_epoch']}): {cause}. "
            + (
                f"{setting} is {allowed}, so nothing is published. To accept them, set {setting}: {total} (or more) "
                f"and rerun: the finished epochs in {run_dir} are kept and nothing is trained again. To train "
                f"without them, fix what made the server fail, delete {run_dir} and rerun."
                if source.online else
                f"Nothing is published: delete {run_dir} and rerun the hidden_states step."
            )
        )
    if total:
        log.warning("speculators' Trainer skipped %d sample(s) (%s), %d allowed (%s)", total, where, allowed,
                    SKIPPED_SETTING)
    else:
        log.info("no sample skipped")
    return {**skipped, "allowed": allowed}


def choose_epoch(run_dir: Path, epochs: int, has_validation: bool, losses: dict[int, float]) -> tuple[int, str]:
    done = finished_epochs(run_dir)
    if (run_dir / INTERRUPTED).is_dir():
        raise RuntimeError(
            f"{run_dir}: speculators' Trainer was interrupted (SIGTERM or SIGINT) and saved "
            f"{run_dir / INTERRUPTED}; nothing is published. Rerun the workflow: training resumes "
            "from the last epoch or step checkpoint (train.checkpoint_freq)."
        )
    if not done or max(done) != epochs - 1:
        raise RuntimeError(
            f"{run_dir}: training ended without a checkpoint at the end of the last epoch "
            f"(epoch {epochs}, folder {epochs - 1}/); found the ends of epochs "
            f"{[e + 1 for e in sorted(done)]}. See the log above."
        )
    if not has_validation:
        return epochs - 1, "train_fraction 1.0: no validation split, so the last epoch"
    best_link = run_dir / "checkpoint_best"
    if best_link.is_symlink() and best_link.resolve().name.isdigit():
        best = int(best_link.resolve().name)
        if best in done:
            return best, (
                f"lowest validation loss ({losses.get(best, float('nan')):.6f}), as marked by "
                "speculators' checkpoint_best"
            )
    return epochs - 1, "no epoch has a finite validation loss (no checkpoint_best): the last epoch"


def view_fidelity(view: Path) -> dict | None:
    """The training view's fidelity record (every shard's check), read before training starts. An
    unreadable manifest stops the job (read_manifest's error names the file and the fix); a folder
    without one (not built by draftline's view step) or a manifest from before the check is said so
    in the log, and its record is None: nothing claims the states were checked."""
    if not (Path(view) / MANIFEST).exists():
        log.warning("%s has no %s (a folder not built by draftline's hidden_states_view step): its hidden "
                    "states were not checked for fidelity, and the draft's provenance says none", view, MANIFEST)
        return None
    manifest = read_manifest(view)
    if "fidelity" not in manifest:
        log.warning("%s: its manifest holds no hidden-state fidelity record (a view made before draftline "
                    "checked fidelity): the draft's provenance and summary say nothing about it; rerun "
                    "the hidden-state shards to check them", view)
    return manifest.get("fidelity")


def publish(run: Run, job: TrainJob, settings: TrainSettings, facts: InputFacts, target: str, record: dict,
            started: float) -> Path:
    """Copy the chosen epoch of `run` to `job.final_dir` in one rename, with the run's records and
    draftline_provenance.json (`record`: how the run was made; `started`: when the Trainer did)."""
    losses = metrics.val_losses(run.metrics_path)
    epoch, reason = choose_epoch(run.dir, settings.epochs, settings.train_fraction < 1.0, losses)
    chosen = epoch_dirs(run.dir)[epoch]
    algorithms.check_checkpoint(chosen, algorithms.get(facts.algorithm), facts.config)
    throughput = metrics.throughput(run.metrics_path)
    log.info(
        "chose epoch %d (%s); val loss per epoch (from 1) %s; %s",
        epoch + 1, reason, {e + 1: round(v, 6) for e, v in losses.items()}, throughput,
    )
    local_target = Path(target).resolve()
    with atomic_dir(job.final_dir) as staging:
        for name in FINAL_FILES:
            shutil.copy2(chosen / name, staging / name)
        # the run's records travel with the draft: the report's loss plot reads them from here
        for name in ("train_command.txt", "run.yaml", run.metrics_path.name):
            if (run.dir / name).exists():
                shutil.copy2(run.dir / name, staging / name)
        if (chosen / "val_metrics.json").exists():
            shutil.copy2(chosen / "val_metrics.json", staging / "val_metrics.json")
        if job.verifier_name:
            name_verifier(staging / "config.json", job.verifier_name)
            name_verifier_in_run_records(staging, job.verifier_name, local_target)
        provenance = {
            "run_key": run.key,
            "algorithm": facts.algorithm,
            "run_dir": str(run.dir),
            # epochs counted from 1, as in every log and the report; the folder is speculators' name
            "chosen_epoch": epoch + 1,
            "chosen_epoch_folder": chosen.name,
            "reason": reason,
            "epochs": settings.epochs,
            "val_loss_per_epoch": {str(k + 1): v for k, v in losses.items()},
            "settings": asdict(settings),
            **record,
            "wall_s": round(time.monotonic() - started, 1),
            "throughput": throughput,
            "inputs": run.fingerprints,
            # the checkpoint names the target by verifier_name; trained against this folder
            "verifier": {"name": job.verifier_name, "local_path": str(local_target)},
        }
        (staging / "draftline_provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    return Path(job.final_dir)


def name_verifier(config_path: Path, name: str) -> None:
    """Name the target `name` in a checkpoint's config.json (speculators_config.verifier.name_or_path)
    instead of the local path training used, so the published draft carries no local path."""
    config = json.loads(config_path.read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = name
    with atomic_file(config_path) as handle:
        handle.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _rename_in_run_yaml(run_yaml: Path, name: str, note: str) -> None:
    import yaml

    record = yaml.safe_load(run_yaml.read_text())
    try:
        record["train"]["verifier"]["verifier_name_or_path"] = name
    except (KeyError, TypeError) as err:
        raise ValueError(f"{run_yaml}: no train.verifier.verifier_name_or_path to rename ({err!r})") from err
    with atomic_file(run_yaml) as handle:
        handle.write(note + "\n" + yaml.safe_dump(record, sort_keys=False, default_flow_style=False))


def _rename_in_train_command(command_file: Path, name: str, note: str) -> None:
    import shlex

    # comment lines (time, git SHA, versions), then the argv as one shlex-joined line
    lines = command_file.read_text().splitlines()
    header = [line for line in lines if line.startswith("#")]
    commands = [shlex.split(line) for line in lines if line.strip() and not line.startswith("#")]
    for argv in commands:
        if "--verifier-name-or-path" in argv:
            argv[argv.index("--verifier-name-or-path") + 1] = name
        if argv and argv[0].endswith("train/entry.py"):  # sys.argv[0]: this checkout's file
            argv[:1] = ["python", "-m", "draftline.stages.train.entry"]
    with atomic_file(command_file) as handle:
        handle.write("\n".join([*header, note, *(shlex.join(argv) for argv in commands)]) + "\n")


def name_verifier_in_run_records(folder: Path, name: str, local_path: Path) -> None:
    """Name the target `name` in the copies of speculators' run.yaml and train_command.txt in
    `folder` (final/), which record --verifier-name-or-path as training got it: the local path
    (`local_path`), which stays in draftline_provenance.json only. Each file says so in a comment;
    the command starts as `python -m draftline.stages.train.entry` (speculators records sys.argv[0], the
    checkout's absolute path to the module); the rest is speculators' record as written (run.yaml
    re-dumped as speculators dumps it)."""
    note = (
        f"# draftline: the verifier is named {name} here, as in config.json; training read it from "
        "the local folder in draftline_provenance.json (verifier.local_path)"
    )
    run_yaml, command_file = folder / "run.yaml", folder / "train_command.txt"
    if run_yaml.exists():
        _rename_in_run_yaml(run_yaml, name, note)
    if command_file.exists():
        _rename_in_train_command(command_file, name, note)
    for path in (run_yaml, command_file):
        if path.exists() and str(local_path) in path.read_text():
            raise ValueError(
                f"{path} still holds the target's local path {local_path} after naming the verifier "
                f"{name}: speculators records it somewhere draftline does not rename; report this"
            )
