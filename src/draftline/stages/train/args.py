"""speculators' train command line: the flags draftline's settings and inputs become, and the
command that runs them (`draftline.stages.train.entry`, through torchrun with one process per GPU on
CUDA)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from draftline import algorithms
from draftline.algorithms import DraftSettings
from draftline.artifacts.hidden_states import TRAINER_BACKEND
from draftline.settings.draft import resolve_num_workers, resolve_optimizer
from draftline.stages.train.inputs import InputFacts
from draftline.stages.train.settings import TrainInputs, TrainSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerOptions:
    """What this job resolved for the Trainer beyond the settings: the optimizer and loader
    workers for its device ("auto"), FSDP (CUDA only), and target.trust_remote_code."""

    optimizer: str = "adamw"
    num_workers: int = 0
    fsdp: bool = False
    trust_remote_code: bool = False

    @classmethod
    def resolve(cls, settings: TrainSettings, cuda: bool, online: bool, trust_remote_code: bool) -> TrainerOptions:
        if settings.fsdp and not cuda:
            log.warning("train.fsdp is set but training runs on the CPU: ignored (FSDP shards across GPUs)")
        return cls(
            optimizer=resolve_optimizer(settings.optimizer, cuda),
            num_workers=resolve_num_workers(settings.num_workers, cuda, online),
            fsdp=settings.fsdp and cuda,
            trust_remote_code=trust_remote_code,
        )


def train_data_ratio(settings: TrainSettings, rows: int) -> float:
    """speculators' --train-data-ratio for `rows` rows; both splits need a row."""
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
    return fraction


def speculators_args(inputs: TrainInputs, settings: TrainSettings, facts: InputFacts, options: TrainerOptions,
                     run_dir: Path, vllm_endpoint: str | None = None) -> list[str]:
    """speculators' train flags; with `vllm_endpoint` the Trainer asks that server for every
    sample's hidden states (`inputs.hidden_states` is then the server's scratch folder)."""
    algorithm = algorithms.get(facts.algorithm)
    fraction = train_data_ratio(settings, facts.rows)
    return [
        "--verifier-name-or-path", str(inputs.target),
        "--from-pretrained", str(inputs.config_dir),
        "--d2t-path", str(inputs.d2t),
        "--t2d-path", str(inputs.t2d),
        "--draft-vocab-size", str(facts.draft_vocab_size),
        "--data-path", str(inputs.dataset),
        "--hidden-states-path", str(inputs.hidden_states),
        "--target-layer-ids", *[str(i) for i in facts.aux],
        "--hidden-states-dtype", facts.hidden_states_dtype,
        # speculators' reader for the files' format (fp8: its FP8Transfer dequantizes them)
        "--hidden-states-backend", TRAINER_BACKEND[facts.hidden_states_format],
        # offline: never ask a vLLM server for missing hidden states; online: always
        *(["--on-missing", "generate", "--vllm-endpoint", vllm_endpoint] if vllm_endpoint
          else ["--on-missing", "raise"]),
        "--epochs", str(settings.epochs),
        "--lr", repr(float(settings.lr)),
        "--optimizer", options.optimizer,
        "--total-seq-len", str(settings.total_seq_len),
        "--train-data-ratio", repr(fraction),
        *algorithm.trainer_args(DraftSettings(ttt_steps=settings.ttt_steps), facts.config),
        "--seed", str(settings.seed),
        "--loss-implementation", "eager",  # the fused loss fails inside torch.compile
        "--draft-attn-impl", "sdpa",
        "--num-workers", str(options.num_workers),
        "--save-path", str(run_dir),
        "--log-dir", str(run_dir / "logs"),
        *(["--checkpoint-freq", repr(float(settings.checkpoint_freq))] if settings.checkpoint_freq < 1 else []),
        *(["--fsdp-shard"] if options.fsdp else []),
        # target.trust_remote_code: the verifier's config and embeddings may need its code
        *(["--trust-remote-code"] if options.trust_remote_code else []),
    ]


def launch_command(args: list[str], cuda: bool, gpus: int) -> list[str]:
    if cuda:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(gpus), "-m", "draftline.stages.train.entry", *args,
        ]
    return [sys.executable, "-m", "draftline.stages.train.entry", *args]
