"""What the stages read from the target folder (`resources/target/<name>/`, a local folder or a
cached hub snapshot), through speculators' own readers so the numbers are the ones its Trainer
and config builder use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TargetDims:
    hidden_size: int
    num_hidden_layers: int


def dims(target_dir: str | Path, trust_remote_code: bool = False) -> TargetDims:
    """Hidden size and depth (the text config of a multimodal model)."""
    from speculators.models.utils import get_verifier_config

    cfg = get_verifier_config(str(target_dir), trust_remote_code=trust_remote_code)
    return TargetDims(int(cfg.hidden_size), int(cfg.num_hidden_layers))


def vocab_size(target_dir: str | Path, trust_remote_code: bool = False) -> int:
    """The verifier's vocabulary as speculators sizes t2d (config.vocab_size, text config)."""
    from speculators.train.vocab_mapping import get_target_vocab_size

    return int(get_target_vocab_size(None, str(target_dir), trust_remote_code=trust_remote_code))
