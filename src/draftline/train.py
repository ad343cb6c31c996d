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

Hidden states come from the extracted files (`hidden_states.mode: offline`), or, online, from a
vLLM server this job starts for the target (`backends.vllm_server`): the Trainer runs with
`--on-missing generate` against it and the server is stopped when training ends or fails. On
CUDA the server takes the first `hidden_states.online_server_gpus` of the job's GPUs and the
Trainer the rest; on CPU each gets half the job's threads. The run key then holds the server's
settings in place of the files' fingerprint. A sample the server gives no hidden states for
(after speculators' retries) is skipped by the Trainer with only a warning: train_entry counts
them in metrics.jsonl, and more than `hidden_states.online_max_skipped_samples` stops the job
before publishing (`check_skipped_samples`); the count goes into draftline_provenance.json.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from draftline import algorithms, fidelity
from draftline.algorithms import DraftSettings
from draftline.artifacts import layer_ids, metrics
from draftline.artifacts.hidden_states import TRAINER_BACKEND, file_name, read_manifest, validate_hidden_states
from draftline.atomic import atomic_dir, atomic_file
from draftline.config_schema import default
from draftline.content_hash import digest, fingerprint
from draftline.engine import EngineSettings
from draftline.plan import resolve_num_workers, resolve_optimizer

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


@dataclass(frozen=True)
class TrainSettings:
    """The `train:` config block (names as in config/schema/config.schema.yaml)."""

    epochs: int = default("train", "epochs")
    lr: float = default("train", "lr")
    optimizer: str = default("train", "optimizer")  # auto | adamw | muon
    total_seq_len: int = default("train", "total_seq_len")
    train_fraction: float = default("train", "train_fraction")
    ttt_steps: int = default("train", "ttt_steps")
    seed: int = default("train", "seed")
    fsdp: bool = default("train", "fsdp")  # shard the draft across GPUs (speculators --fsdp-shard); CUDA only
    # data-loader workers per process: auto = 0 on CPU, 4 on CUDA
    num_workers: int | str = default("train", "num_workers")
    keep_old_runs: bool = default("train", "keep_old_runs")  # keep runs/<key> folders of earlier settings after publishing
    # resumable checkpoints per epoch as a fraction (speculators' --checkpoint-freq; 1 = epoch ends only)
    checkpoint_freq: float = default("train", "checkpoint_freq")

    @classmethod
    def from_config(cls, block: dict) -> TrainSettings:
        known = {k: block[k] for k in cls.__dataclass_fields__ if k in block}
        return cls(**known)


@dataclass(frozen=True)
class TrainInputs:
    config_dir: Path
    dataset: Path
    hidden_states: Path | None  # None in online mode
    d2t: Path
    t2d: Path
    layer_ids: Path
    target: str


@dataclass(frozen=True)
class HiddenStateSource:
    """Where the Trainer's hidden states come from (`hidden_states.mode` and the online keys)."""

    mode: str = default("hidden_states", "mode")  # offline | online
    server_gpus: int = default("hidden_states", "online_server_gpus")
    ready_timeout_s: float = default("hidden_states", "online_server_timeout_s")
    max_seq_len: int = default("tokenize", "max_seq_len")  # the server's max_model_len - 1
    dtype: str = "auto"  # the planned engine dtype
    server_log: str = "logs/train_vllm_server.log"
    # samples the Trainer may skip for want of the server's hidden states (0 offline: files are checked)
    max_skipped_samples: int = default("hidden_states", "online_max_skipped_samples")
    # online: rows asked from the server and checked before the Trainer starts (draftline.fidelity)
    fidelity: fidelity.FidelitySettings = fidelity.FidelitySettings()
    # online: the run's vLLM settings, which the server loads the target with (None: the defaults
    # with `dtype`)
    engine: EngineSettings | None = None

    @property
    def online(self) -> bool:
        return self.mode == "online"


# Settings that do not change the training trajectory: a retry after changing them resumes.
NOT_IN_RUN_KEY = ("num_workers", "keep_old_runs", "checkpoint_freq")
# ---------------------------------------------------------------- input checks


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read JSON ({err})") from err


def check_inputs(inputs: TrainInputs, online_dtype: str | None = None) -> dict:
    """Check that the inputs fit together before spending time; return what training needs.

    `online_dtype`: the server's dtype in online mode (no hidden-state files to check)."""
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
    algorithm = algorithms.of_config(config, str(config_path))
    facts = algorithm.config_facts(config)
    aux = layer_ids.read(inputs.layer_ids).aux
    if facts.aux_layer_ids != aux:
        raise ValueError(
            f"{config_path}: the draft reads target layers {facts.aux_layer_ids}, but {inputs.layer_ids} "
            f"has aux {aux}; rerun the speculator_config step"
        )
    hidden = facts.hidden_size
    draft_vocab = facts.draft_vocab_size
    d2t, t2d = np.load(inputs.d2t), np.load(inputs.t2d)
    target_vocab = facts.target_vocab_size
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
    if online_dtype is not None:
        if online_dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"target.dtype {online_dtype}: the online server would make {online_dtype} hidden states; "
                "speculators trains on float32 or bfloat16 ones: set target.dtype"
            )
        # the server's connector writes full-precision files (hidden_states.format is offline's)
        return {"rows": rows, "hidden_states_dtype": online_dtype, "hidden_states_format": "full", "aux": aux,
                "draft_vocab_size": draft_vocab, "algorithm": algorithm, "facts": facts}  # fmt: skip
    missing = [i for i in range(rows) if not (Path(inputs.hidden_states) / file_name(i)).exists()]
    if missing:
        raise ValueError(
            f"{inputs.hidden_states}: no hidden states for {len(missing)} of {rows} dataset rows "
            f"(e.g. hs_{missing[0]}.safetensors); rerun the hidden_states step"
        )
    first = Path(inputs.hidden_states) / file_name(0)
    with safe_open(str(first), framework="pt") as handle:
        states = handle.get_slice("hidden_states")
        shape, dtype = states.get_shape(), states.get_dtype()
    expected = [len(aux) + 1, hidden]
    if list(shape[1:]) != expected:
        raise ValueError(
            f"{first}: hidden_states has shape {shape}, expected [seq, {expected[0]}, {expected[1]}] "
            f"(aux layers {aux} + the last layer, target hidden size {hidden})"
        )
    if dtype == "F8_E4M3":
        # hidden_states.format fp8: speculators' FP8 reader dequantizes, and the Trainer casts to
        # the dtype the states were extracted in (the view's manifest records it)
        fmt, torch_dtype = "fp8", read_manifest(inputs.hidden_states)["dtype"]
    else:
        fmt, torch_dtype = "full", {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(dtype)
    if torch_dtype is None or torch_dtype == "float16":
        raise ValueError(
            f"{first}: hidden states are {dtype}; speculators trains on float32 or bfloat16 ones"
        )
    # Every file, not just the first: a truncated file, foreign token ids or NaN/inf must stop
    # training before it starts. Shards holding a bad file are removed (with the view), so the
    # rerun re-extracts only those.
    validate_hidden_states(
        inputs.dataset, inputs.hidden_states, len(aux) + 1, hidden, dtype=torch_dtype, format=fmt,
        remove_bad_shards=True,
    )  # fmt: skip
    return {"rows": rows, "hidden_states_dtype": torch_dtype, "hidden_states_format": fmt, "aux": aux,
            "draft_vocab_size": draft_vocab, "algorithm": algorithm, "facts": facts}  # fmt: skip


# ---------------------------------------------------------------- run key


def input_fingerprints(inputs: TrainInputs, server: dict | None = None) -> dict[str, str]:
    """Each input's `content_hash.fingerprint` (content, or stat for the big hidden states); in
    online mode the server's settings stand for the hidden states (the target is already here)."""
    hidden = (
        hashlib.sha256(json.dumps({"online": server}, sort_keys=True).encode()).hexdigest() if server is not None
        else digest(fingerprint(inputs.hidden_states, limit=0))
    )  # fmt: skip
    return {
        "config": digest(fingerprint(Path(inputs.config_dir) / "config.json")),
        "d2t": digest(fingerprint(inputs.d2t)),
        "t2d": digest(fingerprint(inputs.t2d)),
        "layer_ids": digest(fingerprint(inputs.layer_ids)),
        "dataset": digest(fingerprint(inputs.dataset)),
        "hidden_states": hidden,
        "target": digest(fingerprint(inputs.target)) if Path(inputs.target).exists() else str(inputs.target),
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
    for epoch, folder in epoch_dirs(run_dir).items():
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


# ---------------------------------------------------------------- the run


def speculators_args(
    inputs: TrainInputs, settings: TrainSettings, run_dir: Path, hs_dtype: str, optimizer: str,
    aux: list[int], rows: int, draft_vocab: int, num_workers: int = 0, fsdp: bool = False,
    trust_remote_code: bool = False, algorithm: str = "eagle3", hs_format: str = "full",
    vllm_endpoint: str | None = None,
) -> list[str]:  # fmt: skip
    """speculators' train flags; with `vllm_endpoint` the Trainer asks that server for every
    sample's hidden states (`inputs.hidden_states` is then the server's scratch folder)."""
    algorithm = algorithms.get(algorithm)
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
        # speculators' reader for the files' format (fp8: its FP8Transfer dequantizes them)
        "--hidden-states-backend", TRAINER_BACKEND[hs_format],
        # offline: never ask a vLLM server for missing hidden states; online: always
        *(["--on-missing", "generate", "--vllm-endpoint", vllm_endpoint] if vllm_endpoint
          else ["--on-missing", "raise"]),
        "--epochs", str(settings.epochs),
        "--lr", repr(float(settings.lr)),
        "--optimizer", optimizer,
        "--total-seq-len", str(settings.total_seq_len),
        "--train-data-ratio", repr(fraction),
        *algorithm.trainer_args(DraftSettings(ttt_steps=settings.ttt_steps)),
        "--seed", str(settings.seed),
        "--loss-implementation", "eager",  # the fused loss fails inside torch.compile
        "--draft-attn-impl", "sdpa",
        "--num-workers", str(num_workers),
        "--save-path", str(run_dir),
        "--log-dir", str(run_dir / "logs"),
        *(["--checkpoint-freq", repr(float(settings.checkpoint_freq))] if settings.checkpoint_freq < 1 else []),
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


def _child_env(threads: int, metrics_path: Path, devices: list[str] | None = None) -> dict:
    import draftline

    src = str(Path(draftline.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH", "")] if p)
    env["DRAFTLINE_TORCH_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    env["DRAFTLINE_METRICS_PATH"] = str(metrics_path)
    env["COLUMNS"] = "160"  # speculators' rich console wraps at 80 columns off a terminal
    env["PYTHONUNBUFFERED"] = "1"
    # progress bars (transformers' "Writing model shards") redraw into the log; the
    # `[draftline] step N/M` lines say where training is
    env["TQDM_DISABLE"] = "1"
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    return env


# Lines the Trainer prints on every run that no setting changes (not errors, not progress).
TRAINER_NOISE = (
    "`model.safetensors.index.json` file not found",
    "speculators.utils.loading:_resolve_file",  # "Loading from local directory: ..."
    "━━━━━━━━━━",  # speculators' per-epoch bars (rich), epochs counted from 0: `[draftline] step N/M` says it
)


def run_trainer(command: list[str], env: dict) -> None:
    """Run the child, forwarding its output line by line into this step's log."""
    child_log = logging.getLogger("draftline.train.speculators")
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc, _forward_sigterm(proc):
        tail: list[str] = []
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                line = line.rstrip()
                if line and not any(noise in line for noise in TRAINER_NOISE):
                    child_log.info("%s", line)
                    tail = (tail + [line])[-30:]
            proc.wait()
        except BaseException:
            proc.terminate()  # a killed job must not leave a trainer running
            try:  # speculators saves on SIGTERM; drain its output so it never blocks on a full pipe
                for line in proc.stdout:  # type: ignore[union-attr]
                    if line.strip():
                        child_log.info("%s", line.rstrip())
                proc.wait(timeout=120)
            except Exception:  # noqa: BLE001
                proc.kill()
            raise
    if proc.returncode != 0:
        raise RuntimeError(
            f"speculators' Trainer exited with status {proc.returncode}; last lines:\n" + "\n".join(tail)
        )


class Terminated(Exception):
    """SIGTERM reached the training job (Slurm preemption, a time limit, scancel)."""


@contextlib.contextmanager
def _forward_sigterm(proc: subprocess.Popen):
    """SIGTERM to this job (Slurm sends it to every process of a preempted or timed-out job, a
    local kill only to this one) is passed to the Trainer, which saves and exits; the job then
    fails without publishing, and its rerun resumes from the last epoch or step checkpoint.
    Without this the job would die at once and leave the Trainer running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        log.warning("received SIGTERM: stopping the Trainer (it resumes from its last checkpoint on a rerun)")
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_world_size(planned: dict, gpus: int, server_gpus: int = 0) -> int:
    """The job's GPU count, whose Trainer share (all but the online server's `server_gpus`) must
    be the world size the plan resolved (it is a param)."""
    if planned.get("device") == "cuda" and gpus - server_gpus != planned["world_size"]:
        raise ValueError(
            f"this training job was given {gpus} GPU(s)"
            + (f", {server_gpus} of them for the online hidden-state server," if server_gpus else "")
            + f" but planned for world size {planned['world_size']}: set the train rule's gpu resource "
            "where the plan reads it (the profile's set-resources, or --set-resources train:gpu=N) as a "
            "plain number"
        )
    return gpus


def split_devices(devices: list[str], server_gpus: int) -> tuple[list[str], list[str]]:
    """Online mode on CUDA: the first `server_gpus` devices for the server, the rest for the Trainer."""
    if len(devices) <= server_gpus:
        raise ValueError(
            f"hidden_states.mode online: the train job has {len(devices)} GPU(s) "
            f"({','.join(devices) or 'none'}) but the server takes hidden_states.online_server_gpus = "
            f"{server_gpus} and the Trainer needs at least one more: give the train rule "
            f"gpu={server_gpus + 1} or more (--set-resources train:gpu=N), or lower online_server_gpus"
        )
    return devices[:server_gpus], devices[server_gpus:]


def split_threads(threads: int) -> tuple[int, int]:
    """Online mode on CPU: (server, Trainer) threads, half each, at least one each."""
    server = max(1, threads // 2)
    return server, max(1, threads - server)


def _exit_on_sigterm() -> None:
    """A terminated job (Snakemake, Slurm) unwinds: the Trainer and the server are stopped."""
    if threading.current_thread() is threading.main_thread():

        def handler(signum, frame):
            raise SystemExit(f"terminated by signal {signum}")

        signal.signal(signal.SIGTERM, handler)


def train(
    inputs: TrainInputs,
    settings: TrainSettings,
    runs_dir: str | Path,
    final_dir: str | Path,
    threads: int = 1,
    gpus: int = 0,
    trust_remote_code: bool = False,
    verifier_name: str | None = None,
    source: HiddenStateSource = HiddenStateSource(),
) -> Path:
    """Train (or resume) and publish `final_dir`; return it. `verifier_name` replaces the
    target's local path in final/config.json (None keeps the path)."""
    import torch

    from draftline.devices import visible_gpus

    cuda = torch.cuda.is_available() and gpus > 0
    if gpus > 0 and not torch.cuda.is_available():
        log.info("no CUDA here (the job was given %d GPU(s)): training on the CPU", gpus)
    server_devices = trainer_devices = None
    trainer_threads = threads
    server = None
    if source.online:
        _exit_on_sigterm()
        if cuda:
            server_devices, trainer_devices = split_devices(visible_gpus()[:gpus], source.server_gpus)
            log.info("online hidden states: server on GPU(s) %s, Trainer on GPU(s) %s",
                     ",".join(server_devices), ",".join(trainer_devices))  # fmt: skip
            server_threads = 1
        else:
            server_threads, trainer_threads = split_threads(threads)
            log.info("online hidden states on CPU: server %d thread(s), Trainer %d", server_threads, trainer_threads)
        from draftline.backends.vllm_server import ServerSettings

        engine = source.engine or EngineSettings(dtype=source.dtype, trust_remote_code=trust_remote_code)
        server = ServerSettings(
            target_dir=str(inputs.target),
            extracted=tuple(layer_ids.read(inputs.layer_ids).extracted),
            # the run's vLLM settings; the context: the row plus the one generated token
            engine=replace(engine, max_model_len=source.max_seq_len + 1, threads=server_threads),
            cuda=cuda,
        )
    world_size = (len(trainer_devices) if trainer_devices else min(gpus, torch.cuda.device_count())) if cuda else 1
    optimizer = resolve_optimizer(settings.optimizer, cuda)
    num_workers = resolve_num_workers(settings.num_workers, cuda, source.online)
    if settings.fsdp and not cuda:
        log.warning("train.fsdp is set but training runs on the CPU: ignored (FSDP shards across GPUs)")
    fsdp = settings.fsdp and cuda
    facts = check_inputs(inputs, server.dtype if server else None)
    # what decides the server's states (its thread count, memory, eager mode and port do not)
    server_key = server.key() if server else None
    fingerprints = input_fingerprints(inputs, server_key)
    key = run_key(replace(settings, fsdp=fsdp), optimizer, world_size, fingerprints)
    run_dir = Path(runs_dir) / key
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "draftline_run.json").write_text(
        json.dumps({"settings": asdict(settings), "optimizer": optimizer, "world_size": world_size,
                    "inputs": {k: str(v) for k, v in asdict(inputs).items()},
                    "fingerprints": fingerprints}, indent=1) + "\n"
    )  # fmt: skip
    discard_incomplete_epochs(run_dir)
    log.info(
        "run %s: %d rows, %s hidden states (format %s), optimizer %s, %s, %s",
        key, facts["rows"], facts["hidden_states_dtype"], facts["hidden_states_format"], optimizer,
        f"{world_size} GPU process(es)" if cuda else f"CPU with {trainer_threads} thread(s)",
        describe_start(run_dir, settings.epochs),
    )  # fmt: skip

    metrics_path = run_dir / "metrics.jsonl"

    def run(run_inputs: TrainInputs, endpoint: str | None = None) -> None:
        args = speculators_args(
            run_inputs, settings, run_dir, facts["hidden_states_dtype"], optimizer,
            facts["aux"], facts["rows"], facts["draft_vocab_size"], num_workers, fsdp, trust_remote_code,
            facts["algorithm"].name, facts["hidden_states_format"], vllm_endpoint=endpoint,
        )  # fmt: skip
        command = launch_command(args, cuda, world_size)
        log.info("running: %s", " ".join(command))
        env = _child_env(trainer_threads, metrics_path, trainer_devices)
        if endpoint:
            env["DRAFTLINE_HS_LOCK_TIMEOUT_S"] = str(source.ready_timeout_s)  # train_entry.patch_lock_wait
        run_trainer(command, env)
    started = time.monotonic()
    server_record = None
    if server is not None:
        from draftline.backends.vllm_server import VllmServer

        # the server writes each sample's file here; the Trainer reads and deletes it
        scratch = run_dir / "online_hidden_states"
        shutil.rmtree(scratch, ignore_errors=True)
        with VllmServer(server, scratch, source.server_log, source.ready_timeout_s, server_devices) as running:
            checked = check_online_fidelity(inputs, running.endpoint, source, server, trust_remote_code)
            run(replace(inputs, hidden_states=scratch), running.endpoint)
            ready_s = running.ready_s
        shutil.rmtree(scratch, ignore_errors=True)
        server_record = {"mode": "online", "server": server.record(), "server_ready_s": ready_s,
                         "server_log": str(source.server_log),
                         "server_devices": server_devices, "trainer_devices": trainer_devices,
                         "fidelity": checked}  # fmt: skip
    else:
        run(inputs)
    log.info("trainer finished in %.1f s", time.monotonic() - started)
    skipped = check_skipped_samples(metrics_path, source, run_dir)

    losses = metrics.val_losses(metrics_path)
    has_validation = settings.train_fraction < 1.0
    epoch, reason = choose_epoch(run_dir, settings.epochs, has_validation, losses)
    chosen = epoch_dirs(run_dir)[epoch]
    algorithms.check_checkpoint(chosen, facts["algorithm"], facts["facts"])
    throughput = metrics.throughput(metrics_path)
    log.info(
        "chose epoch %d (%s); val loss per epoch (from 1) %s; %s",
        epoch + 1, reason, {e + 1: round(v, 6) for e, v in losses.items()}, throughput,
    )  # fmt: skip

    with atomic_dir(final_dir) as staging:
        for name in FINAL_FILES:
            shutil.copy2(chosen / name, staging / name)
        # the run's records travel with the draft: the report's loss plot reads them from here
        for name in ("train_command.txt", "run.yaml", metrics_path.name):
            if (run_dir / name).exists():
                shutil.copy2(run_dir / name, staging / name)
        if (chosen / "val_metrics.json").exists():
            shutil.copy2(chosen / "val_metrics.json", staging / "val_metrics.json")
        if verifier_name:
            name_verifier(staging / "config.json", verifier_name)
            name_verifier_in_run_records(staging, verifier_name, Path(inputs.target).resolve())
        provenance = {
            "run_key": key,
            "algorithm": facts["algorithm"].name,
            "run_dir": str(run_dir),
            # epochs counted from 1, as in every log and the report; the folder is speculators' name
            "chosen_epoch": epoch + 1,
            "chosen_epoch_folder": chosen.name,
            "reason": reason,
            "epochs": settings.epochs,
            "val_loss_per_epoch": {str(k + 1): v for k, v in losses.items()},
            "settings": asdict(settings),
            "optimizer": optimizer,
            "num_workers": num_workers,
            "fsdp": fsdp,
            "world_size": world_size,
            "device": "cuda" if cuda else "cpu",
            "threads": trainer_threads,
            "hidden_states_dtype": facts["hidden_states_dtype"],
            "hidden_states_format": facts["hidden_states_format"],
            # offline: the files (their fingerprint is under inputs); online: the target (its
            # fingerprint under inputs) and the server that made them
            "hidden_states": server_record or {"mode": "offline", "path": str(inputs.hidden_states),
                                               "fidelity": _view_fidelity(inputs.hidden_states)},
            "wall_s": round(time.monotonic() - started, 1),
            "rows": facts["rows"],
            # sample loads the Trainer skipped without hidden states, and how many were allowed
            "skipped_samples": skipped,
            "throughput": throughput,
            "inputs": fingerprints,
            # the checkpoint names the target by verifier_name; trained against this folder
            "verifier": {"name": verifier_name, "local_path": str(Path(inputs.target).resolve())},
        }
        (staging / "draftline_provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    if not settings.keep_old_runs:
        prune_old_runs(Path(runs_dir), keep=key)
    return Path(final_dir)


def check_skipped_samples(metrics_path: Path, source: HiddenStateSource, run_dir: Path) -> dict:
    """The samples speculators' Trainer skipped (`metrics.skipped_samples`, counted by
    train_entry.install_skip_counter) with the number allowed (`allowed`); more than allowed stops
    the job before anything is published."""
    skipped = metrics.skipped_samples(metrics_path)
    allowed = source.max_skipped_samples if source.online else 0
    total = skipped["total"]
    where = f"{skipped['training']} in training, {skipped['validation']} in validation"
    if total > allowed:
        setting = "hidden_states.online_max_skipped_samples"
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
        )  # fmt: skip
    if total:
        log.warning("speculators' Trainer skipped %d sample(s) (%s), %d allowed (%s)", total, where, allowed,
                    "hidden_states.online_max_skipped_samples")  # fmt: skip
    else:
        log.info("no sample skipped")
    return {**skipped, "allowed": allowed}


def check_online_fidelity(inputs: TrainInputs, endpoint: str, source: HiddenStateSource, server,
                          trust_remote_code: bool = False) -> dict | None:  # fmt: skip
    """Online mode, before the Trainer starts: ask the running server for `source.fidelity.rows`
    rows' states (spread over the dataset, as the Trainer would ask for them) and check them
    (`draftline.fidelity`); return the record for provenance. A failure stops the job (the
    server is stopped on the way out) before any training step."""
    from datasets import load_from_disk

    from draftline.backends.vllm_server import request_states

    settings = source.fidelity
    if settings.rows <= 0:
        return None
    t0 = time.monotonic()
    dataset = load_from_disk(str(inputs.dataset))
    sample = fidelity.sample_rows(range(len(dataset)), settings.rows)
    picked = dataset.select(sample).with_format(None)
    ids = dict(zip(sample, picked["input_ids"], strict=True))
    states = request_states(endpoint, ids, timeout_s=source.ready_timeout_s)
    head = fidelity.read_head(inputs.target, trust_remote_code)
    measured = fidelity.measure(
        head, [fidelity.Sample(r, states[r], ids[r], m) for r, m in zip(sample, picked["loss_mask"], strict=True)],
        server.extracted,
    )  # fmt: skip
    where = f"the online hidden-state server for {inputs.target} (log {source.server_log})"
    log.info("fidelity of %s: rows %s: top-1 agreement %s on %d assistant positions (bar %s, %s), %s on all (%.1f s)",
             where, sample, measured["top1_assistant"], measured["assistant_tokens"], settings.min_top1,
             settings.basis, measured["top1_all"], time.monotonic() - t0)  # fmt: skip
    fidelity.check(measured, settings.min_top1, where, settings.basis)
    return fidelity.record(measured, settings)


def _view_fidelity(view: Path | None) -> dict | None:
    """The training view's fidelity record (every shard's check), None for a view from before it."""
    try:
        return read_manifest(view).get("fidelity")
    except (FileNotFoundError, ValueError, TypeError):
        return None


def name_verifier(config_path: Path, name: str) -> None:
    """Name the target `name` in a checkpoint's config.json (speculators_config.verifier.name_or_path)
    instead of the local path training used, so the published draft carries no local path."""
    config = json.loads(config_path.read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = name
    with atomic_file(config_path) as handle:
        handle.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


def name_verifier_in_run_records(folder: Path, name: str, local_path: Path) -> None:
    """Name the target `name` in the copies of speculators' run.yaml and train_command.txt in
    `folder` (final/), which record --verifier-name-or-path as training got it: the local path
    (`local_path`), which stays in draftline_provenance.json only. Each file says so in a comment;
    the command starts as `python -m draftline.train_entry` (speculators records sys.argv[0], the
    checkout's absolute path to the module); the rest is speculators' record as written (run.yaml
    re-dumped as speculators dumps it)."""
    import shlex

    import yaml

    note = (
        f"# draftline: the verifier is named {name} here, as in config.json; training read it from "
        "the local folder in draftline_provenance.json (verifier.local_path)"
    )
    run_yaml = folder / "run.yaml"
    if run_yaml.exists():
        record = yaml.safe_load(run_yaml.read_text())
        try:
            record["train"]["verifier"]["verifier_name_or_path"] = name
        except (KeyError, TypeError) as err:
            raise ValueError(f"{run_yaml}: no train.verifier.verifier_name_or_path to rename ({err!r})") from err
        with atomic_file(run_yaml) as handle:
            handle.write(note + "\n" + yaml.safe_dump(record, sort_keys=False, default_flow_style=False))
    command_file = folder / "train_command.txt"
    if command_file.exists():
        # comment lines (time, git SHA, versions), then the argv as one shlex-joined line
        lines = command_file.read_text().splitlines()
        header = [line for line in lines if line.startswith("#")]
        commands = [shlex.split(line) for line in lines if line.strip() and not line.startswith("#")]
        for argv in commands:
            if "--verifier-name-or-path" in argv:
                argv[argv.index("--verifier-name-or-path") + 1] = name
            if argv and argv[0].endswith("train_entry.py"):  # sys.argv[0]: this checkout's file
                argv[:1] = ["python", "-m", "draftline.train_entry"]
        with atomic_file(command_file) as handle:
            handle.write("\n".join([*header, note, *(shlex.join(argv) for argv in commands)]) + "\n")
    for path in (run_yaml, command_file):
        if path.exists() and str(local_path) in path.read_text():
            raise ValueError(
                f"{path} still holds the target's local path {local_path} after naming the verifier "
                f"{name}: speculators records it somewhere draftline does not rename; report this"
            )


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
