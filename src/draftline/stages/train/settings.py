"""What the train step is given: its settings, its input files, where its hidden states come
from, and the job it runs as (its folders, threads and GPUs, how it names the target)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftline import fidelity
from draftline.runtime.vllm_engine import EngineSettings, output_settings
from draftline.settings import DEFAULTS, DraftlineConfig, TrainBlock


@dataclass(frozen=True)
class TrainSettings:
    """The `train:` config block (names as in config/schema/config.schema.yaml)."""

    epochs: int = DEFAULTS.train.epochs
    lr: float = DEFAULTS.train.lr
    optimizer: str = DEFAULTS.train.optimizer  # auto | adamw | muon
    total_seq_len: int = DEFAULTS.train.total_seq_len
    train_fraction: float = DEFAULTS.train.train_fraction
    ttt_steps: int = DEFAULTS.train.ttt_steps
    seed: int = DEFAULTS.train.seed
    fsdp: bool = DEFAULTS.train.fsdp  # shard the draft across GPUs (speculators --fsdp-shard); CUDA only
    # data-loader workers per process: auto = 0 on CPU, 4 on CUDA
    num_workers: int | str = DEFAULTS.train.num_workers
    keep_old_runs: bool = DEFAULTS.train.keep_old_runs  # keep runs/<key> folders of earlier settings after publishing
    # resumable checkpoints per epoch as a fraction (speculators' --checkpoint-freq; 1 = epoch ends only)
    checkpoint_freq: float = DEFAULTS.train.checkpoint_freq

    @classmethod
    def from_config(cls, block: dict | TrainBlock) -> TrainSettings:
        """The `train:` block (as the rule's param holds it, the plan's resolved optimizer and
        workers in it) read as its model, TrainBlock: a key left out is its default."""
        if not isinstance(block, TrainBlock):
            block = TrainBlock.model_validate({k: v for k, v in block.items() if k in TrainBlock.model_fields})
        return cls(**{k: getattr(block, k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class TrainInputs:
    config_dir: Path
    dataset: Path
    hidden_states: Path | None  # None in online mode
    d2t: Path
    t2d: Path
    layer_ids: Path
    target: str
    # the plan's target identity (the rule's `target` param: content, hub commit or package): the
    # run key's target; None: the folder's fingerprint through the hash cache
    target_identity: dict | None = None


@dataclass(frozen=True)
class HiddenStateSource:
    """Where the Trainer's hidden states come from (`hidden_states.mode` and the online keys).
    Built once per plan (`from_config`) and passed to the train job as one param object, which
    Snakemake does not compare; `outputs()` are its fields that decide staleness."""

    mode: str = DEFAULTS.hidden_states.mode  # offline | online
    server_gpus: int = DEFAULTS.hidden_states.online_server_gpus
    ready_timeout_s: float = DEFAULTS.hidden_states.online_server_timeout_s
    max_seq_len: int = DEFAULTS.tokenize.max_seq_len  # the server's max_model_len - 1
    dtype: str = "auto"  # the planned engine dtype
    server_log: str = "logs/train_vllm_server.log"
    # samples the Trainer may skip for want of the server's hidden states (0 offline: files are checked)
    max_skipped_samples: int = DEFAULTS.hidden_states.online_max_skipped_samples
    # online: rows asked from the server and checked before the Trainer starts (draftline.fidelity)
    fidelity: fidelity.FidelitySettings = fidelity.FidelitySettings()
    # online: the run's vLLM settings, which the server loads the target with (None: the defaults
    # with `dtype`)
    engine: EngineSettings | None = None

    @property
    def online(self) -> bool:
        return self.mode == "online"

    @classmethod
    def from_config(cls, config: DraftlineConfig, *, dtype: str, engine: EngineSettings,
                    fidelity: fidelity.FidelitySettings) -> HiddenStateSource:
        """The typed config's `hidden_states:` mode and online keys, with the plan's engine
        `dtype`, its vLLM settings and the resolved fidelity bar (offline: the mode alone; the
        files are checked as they are extracted)."""
        block = config.hidden_states
        if block.mode != "online":
            return cls(mode=block.mode)
        return cls(mode="online", server_gpus=block.online_server_gpus, dtype=dtype, engine=engine,
                   ready_timeout_s=block.online_server_timeout_s, max_seq_len=config.tokenize.max_seq_len,
                   max_skipped_samples=block.online_max_skipped_samples, fidelity=fidelity)

    def outputs(self) -> dict:
        """The fields that can change the draft, as plain values (the train rule's `hidden_states`
        param, which decides staleness): offline the mode (the files decide by their content), online
        what decides the server's states. The rest (the server's start-up wait, the samples the
        Trainer may skip, the fidelity bar, speed-only engine settings) changes no published checkpoint."""
        if not self.online:
            return {"mode": self.mode}
        engine = self.engine or EngineSettings(dtype=self.dtype)
        return {"mode": self.mode, "server_gpus": self.server_gpus, "max_seq_len": self.max_seq_len,
                "dtype": self.dtype, "engine": output_settings(engine, without=("max_model_len",))}


@dataclass(frozen=True)
class TrainJob:
    """The job training runs as: its folders, what it was given, and how final/ names the target."""

    runs_dir: Path  # one folder per run key (results/checkpoint/runs)
    final_dir: Path  # the published checkpoint (results/checkpoint/final)
    threads: int = 1
    gpus: int = 0  # the job's GPUs (0 or no CUDA: the CPU)
    trust_remote_code: bool = False  # target.trust_remote_code
    # replaces the target's local path in final/config.json and its run records (None keeps the path)
    verifier_name: str | None = None
