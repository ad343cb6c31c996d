"""The training part (after the hidden-state part): one short training step of the run's draft
config through speculators' Trainer, launched by the train stage's own code (its input checks,
placement, flags and torchrun command) with the run's training GPUs and settings, so the train
job is not the first time the Trainer meets the cluster: the process group initialises (NCCL on
CUDA; on the CPU one process, as the train stage runs there), a step runs, a checkpoint is
written, memory is read.

Its input is the smallest that works: the rows the hidden-state part extracted (repeated until
every rank has a training and a validation row), vocab maps from the regeneration part's token
frequencies (the vocab stage's code), one epoch cut at one step (speculators' --max-steps 1),
in a scratch folder removed afterwards. It records the world size, the backend, the step's wall
time and each rank's peak memory (torch.cuda.max_memory_allocated on CUDA, max RSS on the CPU);
a failed Trainer's reason is the failing line of its output (e.g. an NCCL error)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from draftline.artifacts import metrics
from draftline.artifacts.hidden_states import MANIFEST, file_name
from draftline.artifacts.preflight import Check, failed, passed, read_part, write_part
from draftline.preflight.common import Part, attempt, skip_all
from draftline.preflight.hidden_states import EXTRACTION

log = logging.getLogger(__name__)

TRAINING = "training step"  # the check's name, as the report shows it
ENTRY = "draftline.preflight.training_entry"  # train.entry, plus each rank's record
RANKS_ENV = "DRAFTLINE_PREFLIGHT_RANKS"  # the folder the ranks write their records to
# an exception or a collective's error in the Trainer's output (torchrun's own summary names only the child)
ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b[:(]|NCCL (WARN|error)|CUDA error|Segmentation fault|Killed")


@dataclass(frozen=True)
class TrainingStep:
    """The run's training as the check runs it."""

    settings: object  # TrainSettings: the run's `train:` block, optimizer and loader workers resolved
    draft_vocab_size: int  # vocab.draft_vocab_size: the maps made from the extracted rows' frequencies
    gpus: int = 0  # the run's Trainer world size on CUDA (0: the CPU)
    threads: int = 1
    trust_remote_code: bool = False


def failing_line(lines: list[str]) -> str:
    """The line of the Trainer's output that says what failed: the last exception or NCCL/CUDA
    error a rank printed (not torchrun's summary), else the last line."""
    for line in reversed(lines):
        if ERROR_LINE.search(line) and "ChildFailedError" not in line and "elastic" not in line:
            text = re.sub(r"^\[rank\d+\]:\s*", "", line.strip())
            return text if len(text) <= 400 else text[:397] + "..."
    return lines[-1].strip() if lines else "no output"


class _Lines(logging.Handler):
    """The Trainer's output as run_trainer forwards it into the job's log."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _link(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)  # a hard link: the train stage's checks never remove a link's shard
    except OSError:
        shutil.copy2(source, dest)


def step_inputs(part: Part, regenerate_dir, config_dir, layer_ids_path, step: TrainingStep, world_size: int):
    """TrainInputs for the check, in the part's scratch folder: the extracted rows repeated to at
    least two per rank (a training and a validation row each), their hidden-state files linked,
    vocab maps from the rows' frequencies."""
    from datasets import concatenate_datasets, load_from_disk

    from draftline.stages import vocab
    from draftline.stages.train import TrainInputs

    scratch, shard, target_dir = Path(part.out_dir) / "scratch", Path(part.upstream_dir) / "shard", part.target_dir
    tokenized = Path(regenerate_dir) / "tokenized"
    rows = load_from_disk(str(tokenized / "dataset"))
    n = max(len(rows), 2 * world_size)
    repeated = concatenate_datasets([rows] * math.ceil(n / len(rows))).select(range(n))
    repeated.save_to_disk(str(scratch / "dataset"))
    view = scratch / "hidden_states"
    view.mkdir()
    for i in range(n):
        _link(shard / file_name(i % len(rows)), view / file_name(i))
    shutil.copy2(shard / MANIFEST, view / MANIFEST)
    vocab.write_vocab(tokenized / "token_freq.pt", target_dir, step.draft_vocab_size, scratch / "d2t.npy",
                      scratch / "t2d.npy", scratch / "vocab_summary.json", step.trust_remote_code)
    return TrainInputs(config_dir=Path(config_dir), dataset=scratch / "dataset", hidden_states=view,
                       d2t=scratch / "d2t.npy", t2d=scratch / "t2d.npy", layer_ids=Path(layer_ids_path),
                       target=str(target_dir))


def run_training(part: Part, regenerate_dir: str | Path, config_dir: str | Path, layer_ids_path: str | Path,
                 step: TrainingStep) -> dict:
    """The training part: `part.upstream_dir` is the hidden-state part's folder (its extracted shard)."""
    from draftline.stages.train import HiddenStateSource, TrainerOptions, check_inputs, launch_command, speculators_args
    from draftline.stages.train.placement import place
    from draftline.stages.train.run import child_env, run_trainer

    out = Path(part.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extraction = {c.name: c.status for c in read_part(part.upstream_dir)["checks"]}.get(EXTRACTION)
    if extraction != "pass":
        return write_part(out, "training", skip_all([TRAINING], f"no extracted rows (hidden_states: {EXTRACTION} {extraction})"))
    scratch = out / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    measured: dict = {}

    def train_one_step() -> Check:
        where = place(step.gpus, step.threads, HiddenStateSource())  # offline: the extracted files
        device = "cuda" if where.cuda else "cpu"
        if step.gpus and (not where.cuda or where.world_size != step.gpus):
            seen = where.world_size if where.cuda else 0
            return failed(TRAINING, (
                f"the run trains on {step.gpus} GPU(s) (world size {step.gpus}) but this job can start {seen} GPU "
                f"process(es) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): give "
                "preflight_training the train rule's gpu (the profile's set-resources)"), world_size=seen)
        inputs = step_inputs(part, regenerate_dir, config_dir, layer_ids_path, step, where.world_size)
        facts = check_inputs(inputs)  # the train stage's own checks: config, layer ids, vocab maps, every file
        # one epoch, half the rows validation (a row per rank each), stopped after its first step
        settings = replace(step.settings, epochs=1, train_fraction=0.5, checkpoint_freq=1.0)
        options = TrainerOptions.resolve(settings, where.cuda, False, step.trust_remote_code)
        run_dir = scratch / "run"
        args = [*speculators_args(inputs, settings, facts, options, run_dir), "--max-steps", "1"]
        command = [ENTRY if a == "draftline.stages.train.entry" else a for a in launch_command(args, where.cuda, where.world_size)]
        log.info("running: %s", " ".join(command))
        env = child_env(where.trainer_threads, scratch / "metrics.jsonl", where.trainer_devices)
        env[RANKS_ENV] = str(scratch / "ranks")
        lines, output = _Lines(), logging.getLogger("draftline.stages.train.speculators")
        level = output.level
        output.addHandler(lines)
        output.setLevel(logging.INFO)  # every line reaches `lines`, whatever the job's logging
        started = time.monotonic()
        try:
            run_trainer(command, env)
        except RuntimeError as error:
            return failed(TRAINING, (
                f"speculators' Trainer failed ({where.world_size} {device} process(es), {facts.algorithm} draft of "
                f"{config_dir}): {failing_line(lines.lines or str(error).splitlines())} (its output in {part.log_hint})"
            ), world_size=where.world_size, device=device)
        finally:
            output.removeHandler(lines)
            output.setLevel(level)
        seconds = round(time.monotonic() - started, 1)
        ranks = [json.loads(p.read_text()) for p in sorted((scratch / "ranks").glob("rank_*.json"))]
        steps = [r for r in metrics.records(scratch / "metrics.jsonl") if "step_ms" in (r.get("profile") or {})]
        if not steps or len(ranks) != where.world_size:
            return failed(TRAINING, (
                f"speculators' Trainer exited without {'a training step' if not steps else 'every rank'}: "
                f"{len(steps)} step(s) logged, {len(ranks)} of {where.world_size} rank(s) recorded "
                f"(its output in {part.log_hint})"), world_size=where.world_size)
        profile = steps[0]["profile"]
        step_s = round(profile["step_ms"] / 1000, 3)
        tokens = round(profile.get("tokens_per_s", 0.0) * profile["step_ms"] / 1000)
        peaks = [round(r["peak_memory_bytes"] / 1024**3, 2) for r in sorted(ranks, key=lambda r: r["rank"])]
        backend = ranks[0]["backend"] or "none (one process)"
        measure = ranks[0]["memory_measure"]
        measured.update(training_step_seconds=step_s, training_trainer_seconds=seconds,
                        training_peak_memory_gib=max(peaks))
        return passed(TRAINING, (
            f"1 step of the {facts.algorithm} draft ({config_dir}) on {where.world_size} {device} process(es), backend "
            f"{backend}: {step_s} s for {tokens:,} tokens ({seconds} s with start-up and a checkpoint); peak memory per "
            f"rank {', '.join(f'{p} GiB' for p in peaks)} ({measure})"
        ), world_size=where.world_size, backend=backend, device=device, step_seconds=step_s, trainer_seconds=seconds,
            tokens=tokens, peak_memory_gib=peaks, memory_measure=measure, optimizer=options.optimizer)

    try:
        check = attempt(TRAINING, train_one_step, part.log_hint)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the draft checkpoint and the linked files
    return write_part(out, "training", [check], measured)
