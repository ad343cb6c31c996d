"""Train the draft with speculators' own Trainer and publish the chosen checkpoint.

The Trainer runs in a child process (`draftline.train_entry`: speculators' entry point
plus CPU shims), through torchrun with one process per GPU on CUDA. Checkpoints go to
`runs/<run key>/`, where the key hashes the training settings and fingerprints of every
input: a retry with the same inputs resumes from the newest epoch folder (speculators'
own resume), a changed setting or input starts a new run dir instead of resuming a stale
one; once final/ is published, the run folders of earlier settings are removed unless
`train.keep_old_runs` is set. Every epoch is kept (no `--save-best`: it skips saving
non-best epochs, so a resume would repeat them); `checkpoint_best` marks the lowest
validation loss. The chosen epoch (best validation loss, or the last one with
train_fraction 1.0) is copied to `final/` in one rename, with provenance.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from draftline.atomic import atomic_dir

log = logging.getLogger(__name__)

# Files of an epoch folder that final/ needs; training_state.json is written last by
# speculators, so an epoch folder without it was cut short by a kill.
EPOCH_COMPLETE_MARKER = "training_state.json"
FINAL_FILES = ("config.json", "model.safetensors")


@dataclass(frozen=True)
class TrainSettings:
    """The `train:` config block (names as in config/schema/config.schema.yaml)."""

    epochs: int = 3
    lr: float = 1e-3
    optimizer: str = "auto"  # auto | adamw | muon
    total_seq_len: int = 4096
    train_fraction: float = 0.9
    ttt_steps: int = 3
    seed: int = 0
    fsdp: bool = False  # shard the draft across GPUs (speculators --fsdp-shard); CUDA only
    num_workers: int | str = "auto"  # data-loader workers per process: auto = 0 on CPU, 4 on CUDA
    keep_old_runs: bool = False  # keep runs/<key> folders of earlier settings after publishing

    @classmethod
    def from_config(cls, block: dict) -> TrainSettings:
        known = {k: block[k] for k in cls.__dataclass_fields__ if k in block}
        return cls(**known)


@dataclass(frozen=True)
class TrainInputs:
    config_dir: Path
    dataset: Path
    hidden_states: Path
    d2t: Path
    t2d: Path
    layer_ids: Path
    target: str


# Settings that do not change the training trajectory: a retry after changing them resumes.
NOT_IN_RUN_KEY = ("num_workers", "keep_old_runs")
CUDA_NUM_WORKERS = 4


def resolve_num_workers(requested: int | str, cuda: bool) -> int:
    # On CPU the workers would compete with torch's threads for the same cores; on CUDA the
    # batch fetch is ~28% of a step without them (docs/gpu.md).
    if requested == "auto":
        return CUDA_NUM_WORKERS if cuda else 0
    return int(requested)


def resolve_optimizer(requested: str, cuda: bool) -> str:
    # Muon is ~8x slower on CPUs without bf16 (torch's Muon casts gradients to bf16).
    if requested == "auto":
        return "muon" if cuda else "adamw"
    return requested


# ---------------------------------------------------------------- input checks


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read JSON ({err})") from err


def hidden_state_file(hidden_states: Path, row: int) -> Path:
    return Path(hidden_states) / f"hs_{row}.safetensors"


def check_inputs(inputs: TrainInputs) -> dict:
    """Check that the inputs fit together before spending time; return what training needs."""
    import numpy as np
    from datasets import load_from_disk
    from safetensors import safe_open

    config_path = Path(inputs.config_dir) / "config.json"
    config = _read_json(config_path)
    extra = sorted(p.name for p in Path(inputs.config_dir).iterdir() if p.suffix in (".safetensors", ".bin"))
    if extra:
        raise ValueError(
            f"{inputs.config_dir} holds weights ({extra}); it must hold only config.json so "
            "speculators initialises a fresh draft from it"
        )
    aux = [int(i) for i in _read_json(inputs.layer_ids)["aux"]]
    if config.get("eagle_aux_hidden_state_layer_ids") != aux:
        raise ValueError(
            f"{config_path}: eagle_aux_hidden_state_layer_ids "
            f"{config.get('eagle_aux_hidden_state_layer_ids')} != aux {aux} in {inputs.layer_ids}; "
            "rerun the speculator_config step"
        )
    hidden = int(config["transformer_layer_config"]["hidden_size"])
    draft_vocab = int(config["draft_vocab_size"])
    d2t, t2d = np.load(inputs.d2t), np.load(inputs.t2d)
    target_vocab = int(config["transformer_layer_config"]["vocab_size"])
    if d2t.shape != (draft_vocab,) or t2d.shape != (target_vocab,) or int(t2d.sum()) != draft_vocab:
        raise ValueError(
            f"vocab maps {inputs.d2t} {d2t.shape} / {inputs.t2d} {t2d.shape} (t2d has "
            f"{int(t2d.sum())} true) do not fit {config_path} (draft_vocab_size {draft_vocab}, "
            f"target vocab {target_vocab}); rerun the vocab and speculator_config steps"
        )
    try:
        rows = len(load_from_disk(str(inputs.dataset)))
    except Exception as err:
        raise ValueError(f"{inputs.dataset}: cannot open the tokenized dataset ({err})") from err
    missing = [i for i in range(rows) if not hidden_state_file(inputs.hidden_states, i).exists()]
    if missing:
        raise ValueError(
            f"{inputs.hidden_states}: no hidden states for {len(missing)} of {rows} dataset rows "
            f"(e.g. hs_{missing[0]}.safetensors); rerun the hidden_states step"
        )
    first = hidden_state_file(inputs.hidden_states, 0)
    with safe_open(str(first), framework="pt") as handle:
        states = handle.get_slice("hidden_states")
        shape, dtype = states.get_shape(), states.get_dtype()
    expected = [len(aux) + 1, hidden]
    if list(shape[1:]) != expected:
        raise ValueError(
            f"{first}: hidden_states has shape {shape}, expected [seq, {expected[0]}, {expected[1]}] "
            f"(aux layers {aux} + the last layer, target hidden size {hidden})"
        )
    torch_dtype = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(dtype)
    if torch_dtype is None or torch_dtype == "float16":
        raise ValueError(
            f"{first}: hidden states are {dtype}; speculators trains on float32 or bfloat16 ones"
        )
    # Every file, not just the first: a truncated file, foreign token ids or NaN/inf must stop
    # training before it starts. Shards holding a bad file are removed (with the view), so the
    # rerun re-extracts only those.
    from draftline.checks import validate_hidden_states

    validate_hidden_states(
        inputs.dataset, inputs.hidden_states, len(aux) + 1, hidden, dtype=torch_dtype, remove_bad_shards=True
    )
    return {"rows": rows, "hidden_states_dtype": torch_dtype, "aux": aux, "draft_vocab_size": draft_vocab}


# ---------------------------------------------------------------- run key


def _sha256_files(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _stat_fingerprint(paths: list[Path]) -> str:
    """Names, sizes and mtimes: cheap for GBs of hidden states, changes when a file is rewritten."""
    digest = hashlib.sha256()
    for path in paths:
        st = path.stat()  # follows the view's symlinks to the shard files
        digest.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def input_fingerprints(inputs: TrainInputs) -> dict[str, str]:
    target = Path(inputs.target)
    target_files = sorted(p for p in target.glob("*") if p.is_file()) if target.is_dir() else []
    return {
        "config": _sha256_files([Path(inputs.config_dir) / "config.json"]),
        "d2t": _sha256_files([Path(inputs.d2t)]),
        "t2d": _sha256_files([Path(inputs.t2d)]),
        "layer_ids": _sha256_files([Path(inputs.layer_ids)]),
        "dataset": _sha256_files(sorted(p for p in Path(inputs.dataset).glob("*") if p.is_file())),
        "hidden_states": _stat_fingerprint(sorted(Path(inputs.hidden_states).glob("hs_*.safetensors"))),
        "target": _stat_fingerprint(target_files) if target_files else str(inputs.target),
    }


def run_key(settings: TrainSettings, optimizer: str, world_size: int, fingerprints: dict) -> str:
    trajectory = {k: v for k, v in asdict(settings).items() if k not in NOT_IN_RUN_KEY}
    payload = {
        "settings": {**trajectory, "optimizer": optimizer},
        "world_size": world_size,  # changes the global batch, so the trajectory
        "inputs": fingerprints,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- checkpoints


def epoch_dirs(run_dir: Path) -> dict[int, Path]:
    """Complete epoch folders by epoch number (symlinks such as epoch0_end skipped)."""
    found = {}
    if run_dir.is_dir():
        for child in run_dir.iterdir():
            if child.is_dir() and not child.is_symlink() and child.name.isdigit():
                found[int(child.name)] = child
    return dict(sorted(found.items()))


def discard_incomplete_epochs(run_dir: Path) -> None:
    """An epoch folder a kill cut short would make speculators resume from half a checkpoint."""
    for epoch, folder in epoch_dirs(run_dir).items():
        if not (folder / EPOCH_COMPLETE_MARKER).exists() or not all(
            (folder / name).exists() for name in FINAL_FILES
        ):
            log.warning("discarding incomplete checkpoint %s (interrupted while saving)", folder)
            shutil.rmtree(folder)


def val_losses(metrics_path: Path) -> dict[int, float]:
    """Validation loss per epoch (0-based) from the metrics log; a rerun epoch's last value wins."""
    losses: dict[int, float] = {}
    if metrics_path.exists():
        for line in metrics_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if "val" in record and "loss_epoch" in record["val"]:
                losses[int(record["epoch"])] = float(record["val"]["loss_epoch"])
    return dict(sorted(losses.items()))


def train_throughput(metrics_path: Path) -> dict:
    """Tokens/s over all logged steps, and the median step's (without start-up/compile steps)."""
    tokens = seconds = 0.0
    rates: list[float] = []
    if metrics_path.exists():
        for line in metrics_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            profile = record.get("profile") or {}
            if "step_ms" not in profile:
                continue
            step_s = profile["step_ms"] / 1000
            seconds += step_s
            tokens += profile.get("tokens_per_s", 0.0) * step_s
            rates.append(profile.get("tokens_per_s", 0.0))
    rates.sort()
    return {
        "tokens": round(tokens),
        "step_seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "median_step_tokens_per_s": round(rates[len(rates) // 2], 1) if rates else None,
    }


def choose_epoch(run_dir: Path, epochs: int, has_validation: bool, losses: dict[int, float]) -> tuple[int, str]:
    done = epoch_dirs(run_dir)
    if not done or max(done) != epochs - 1:
        raise RuntimeError(
            f"{run_dir}: training ended without a checkpoint for the last epoch "
            f"({epochs - 1}); found epochs {sorted(done)}. See the log above."
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


def check_checkpoint(folder: Path, draft_vocab: int, target_vocab: int, hidden: int, n_aux: int) -> dict:
    """The tensors vLLM's eagle3 loader needs, with the shapes this config implies."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        shapes = {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
    expected = {
        "fc.weight": [hidden, n_aux * hidden],
        "lm_head.weight": [draft_vocab, hidden],
        "d2t": [draft_vocab],
        "t2d": [target_vocab],
    }
    wrong = {k: shapes.get(k) for k, v in expected.items() if shapes.get(k) != v}
    if wrong or not any(k.startswith("layers.0.") for k in shapes):
        raise RuntimeError(
            f"{folder}/model.safetensors: unexpected tensors {wrong} (expected {expected}, and layers.0.*)"
        )
    return shapes


# ---------------------------------------------------------------- the run


def speculators_args(
    inputs: TrainInputs, settings: TrainSettings, run_dir: Path, hs_dtype: str, optimizer: str,
    aux: list[int], rows: int, draft_vocab: int, num_workers: int = 0, fsdp: bool = False,
    trust_remote_code: bool = False,
) -> list[str]:  # fmt: skip
    fraction = settings.train_fraction
    if fraction >= 1.0:
        # speculators 0.9.0 always holds out a validation split (ratio must be < 1): keep
        # one row for it and ignore its loss (the last epoch is published).
        fraction = (rows - 0.5) / rows
    if int(rows * fraction) < 1 or int(rows * fraction) >= rows:
        raise ValueError(
            f"train.train_fraction {settings.train_fraction} splits {rows} rows into "
            f"{int(rows * fraction)} train / {rows - int(rows * fraction)} validation rows; "
            "both need at least one: add data or change train.train_fraction"
        )
    return [
        "--verifier-name-or-path", str(inputs.target),
        "--from-pretrained", str(inputs.config_dir),
        "--d2t-path", str(inputs.d2t),
        "--t2d-path", str(inputs.t2d),
        "--draft-vocab-size", str(draft_vocab),
        "--data-path", str(inputs.dataset),
        "--hidden-states-path", str(inputs.hidden_states),
        "--target-layer-ids", *[str(i) for i in aux],
        "--hidden-states-dtype", hs_dtype,
        "--on-missing", "raise",  # never ask a vLLM server for missing hidden states
        "--epochs", str(settings.epochs),
        "--lr", repr(float(settings.lr)),
        "--optimizer", optimizer,
        "--total-seq-len", str(settings.total_seq_len),
        "--train-data-ratio", repr(fraction),
        "--ttt-steps", str(settings.ttt_steps),
        "--seed", str(settings.seed),
        "--loss-implementation", "eager",  # the fused loss fails inside torch.compile
        "--draft-attn-impl", "sdpa",
        "--num-workers", str(num_workers),
        "--save-path", str(run_dir),
        "--log-dir", str(run_dir / "logs"),
        *(["--fsdp-shard"] if fsdp else []),
        # target.trust_remote_code: the verifier's config and embeddings may need its code
        *(["--trust-remote-code"] if trust_remote_code else []),
    ]  # fmt: skip


def launch_command(args: list[str], cuda: bool, gpus: int) -> list[str]:
    if cuda:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(gpus), "-m", "draftline.train_entry", *args,
        ]  # fmt: skip
    return [sys.executable, "-m", "draftline.train_entry", *args]


def _child_env(threads: int, metrics_path: Path) -> dict:
    import draftline

    src = str(Path(draftline.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH", "")] if p)
    env["DRAFTLINE_TORCH_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    env["DRAFTLINE_METRICS_PATH"] = str(metrics_path)
    env["COLUMNS"] = "160"  # speculators' rich console wraps at 80 columns off a terminal
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_trainer(command: list[str], env: dict) -> None:
    """Run the child, forwarding its output line by line into this step's log."""
    child_log = logging.getLogger("draftline.train.speculators")
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        tail: list[str] = []
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                line = line.rstrip()
                if line:
                    child_log.info("%s", line)
                    tail = (tail + [line])[-30:]
            proc.wait()
        except BaseException:
            proc.terminate()  # a killed job must not leave a trainer running
            proc.wait(timeout=30)
            raise
    if proc.returncode != 0:
        raise RuntimeError(
            f"speculators' Trainer exited with status {proc.returncode}; last lines:\n" + "\n".join(tail)
        )


def check_world_size(planned: dict, gpus: int) -> int:
    """The job's GPU count, which must be the world size the plan resolved (it is a param)."""
    if planned.get("device") == "cuda" and gpus != planned["world_size"]:
        raise ValueError(
            f"this training job was given {gpus} GPU(s) but planned for world size "
            f"{planned['world_size']}: set the train rule's gpu resource where the plan reads it "
            "(the profile's set-resources, or --set-resources train:gpu=N) as a plain number"
        )
    return gpus


def train(
    inputs: TrainInputs,
    settings: TrainSettings,
    runs_dir: str | Path,
    final_dir: str | Path,
    threads: int = 1,
    gpus: int = 0,
    trust_remote_code: bool = False,
) -> Path:
    """Train (or resume) and publish `final_dir`; return it."""
    import torch

    cuda = torch.cuda.is_available() and gpus > 0
    if gpus > 0 and not torch.cuda.is_available():
        log.info("no CUDA here (the job was given %d GPU(s)): training on the CPU", gpus)
    world_size = min(gpus, torch.cuda.device_count()) if cuda else 1
    optimizer = resolve_optimizer(settings.optimizer, cuda)
    num_workers = resolve_num_workers(settings.num_workers, cuda)
    if settings.fsdp and not cuda:
        log.warning("train.fsdp is set but training runs on the CPU: ignored (FSDP shards across GPUs)")
    fsdp = settings.fsdp and cuda
    facts = check_inputs(inputs)
    fingerprints = input_fingerprints(inputs)
    key = run_key(replace(settings, fsdp=fsdp), optimizer, world_size, fingerprints)
    run_dir = Path(runs_dir) / key
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "draftline_run.json").write_text(
        json.dumps({"settings": asdict(settings), "optimizer": optimizer, "world_size": world_size,
                    "inputs": {k: str(v) for k, v in asdict(inputs).items()},
                    "fingerprints": fingerprints}, indent=1) + "\n"
    )  # fmt: skip
    discard_incomplete_epochs(run_dir)
    done = epoch_dirs(run_dir)
    log.info(
        "run %s: %d rows, %s hidden states, optimizer %s, %s, %s",
        key, facts["rows"], facts["hidden_states_dtype"], optimizer,
        f"{world_size} GPU process(es)" if cuda else f"CPU with {threads} thread(s)",
        f"resuming after epoch {max(done) + 1} of {settings.epochs}" if done else "fresh start",
    )  # fmt: skip

    metrics_path = run_dir / "metrics.jsonl"
    args = speculators_args(
        inputs, settings, run_dir, facts["hidden_states_dtype"], optimizer,
        facts["aux"], facts["rows"], facts["draft_vocab_size"], num_workers, fsdp, trust_remote_code,
    )  # fmt: skip
    command = launch_command(args, cuda, world_size)
    log.info("running: %s", " ".join(command))
    started = time.monotonic()
    run_trainer(command, _child_env(threads, metrics_path))
    log.info("trainer finished in %.1f s", time.monotonic() - started)

    losses = val_losses(metrics_path)
    has_validation = settings.train_fraction < 1.0
    epoch, reason = choose_epoch(run_dir, settings.epochs, has_validation, losses)
    chosen = epoch_dirs(run_dir)[epoch]
    config = _read_json(chosen / "config.json")
    tl = config["transformer_layer_config"]
    check_checkpoint(chosen, int(config["draft_vocab_size"]), int(tl["vocab_size"]), int(tl["hidden_size"]), len(facts["aux"]))
    throughput = train_throughput(metrics_path)
    log.info("chose epoch %d (%s); val loss per epoch %s; %s", epoch + 1, reason, losses, throughput)

    with atomic_dir(final_dir) as staging:
        for name in FINAL_FILES:
            shutil.copy2(chosen / name, staging / name)
        for name in ("train_command.txt", "run.yaml"):
            if (run_dir / name).exists():
                shutil.copy2(run_dir / name, staging / name)
        if (chosen / "val_metrics.json").exists():
            shutil.copy2(chosen / "val_metrics.json", staging / "val_metrics.json")
        provenance = {
            "run_key": key,
            "run_dir": str(run_dir),
            "chosen_epoch": epoch,  # speculators' 0-based epoch folder name
            "reason": reason,
            "epochs": settings.epochs,
            "val_loss_per_epoch": {str(k): v for k, v in losses.items()},
            "settings": asdict(settings),
            "optimizer": optimizer,
            "num_workers": num_workers,
            "fsdp": fsdp,
            "world_size": world_size,
            "device": "cuda" if cuda else "cpu",
            "threads": threads,
            "hidden_states_dtype": facts["hidden_states_dtype"],
            "rows": facts["rows"],
            "throughput": throughput,
            "inputs": fingerprints,
        }
        (staging / "draftline_provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    if not settings.keep_old_runs:
        prune_old_runs(Path(runs_dir), keep=key)
    return Path(final_dir)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def prune_old_runs(runs_dir: Path, keep: str) -> list[Path]:
    """Remove the checkpoint folders of earlier settings or inputs (each holds every epoch with
    its optimizer state); only folders this module made (with draftline_run.json) are touched."""
    removed = []
    for folder in sorted(runs_dir.iterdir()):
        if folder.name == keep or not (folder / "draftline_run.json").is_file():
            continue
        size = _size(folder)
        shutil.rmtree(folder)
        log.info("removed the earlier run %s (%.1f MB; train.keep_old_runs: true keeps them)", folder, size / 1e6)
        removed.append(folder)
    return removed
