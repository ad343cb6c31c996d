"""The settings against the target's shape: the numbers of its config.json a setting must fit
(`TargetShape`, read without loading the model) and the checks both the plan (at parse time) and
the jobs (once their inputs are known) make, each a ConfigError naming the key. Import-light (json
only): the Snakefile runs them before any job is planned."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class ConfigError(ValueError):
    """A config value the target (or the data) cannot serve; the message names the key."""


@dataclass(frozen=True)
class TargetShape:
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    source: str  # where the numbers come from, for messages
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None


# SmolLM2-135M-Instruct as materialized from the packaged GGUF (resources/target/.../config.json);
# known before the target_model job has written the folder.
EMBEDDED_SHAPE = TargetShape(
    num_hidden_layers=30, hidden_size=576, vocab_size=49152, max_position_embeddings=8192,
    source="the embedded SmolLM2-135M-Instruct", num_attention_heads=9, num_key_value_heads=3,
)


def shape_from_config(config_path: str | Path) -> TargetShape:
    """The numbers the checks need from a Hugging Face config.json (text config if nested)."""
    path = Path(config_path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the target's config ({err}); repair or replace it") from err
    text = {**raw, **raw.get("text_config", {})} if isinstance(raw.get("text_config"), dict) else raw
    missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if k not in text]
    if missing:
        raise ConfigError(
            f"{path}: no {', '.join(missing)}; is this a decoder-only language model's config.json?"
        )
    max_pos = text.get("max_position_embeddings")
    heads = text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads", heads)
    return TargetShape(
        int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text["vocab_size"]),
        int(max_pos) if max_pos else None, str(path),
        int(heads) if heads else None, int(kv_heads) if kv_heads else None,
    )


def target_shape(kind: str, target_dir: str | Path) -> TargetShape | None:
    """The target's shape without loading it: its config.json when the folder exists, the known
    shape for the embedded model, None for a hub model not downloaded yet (its jobs check)."""
    config = Path(target_dir) / "config.json"
    if config.is_file():
        return shape_from_config(config)
    if kind == "embedded":
        return EMBEDDED_SHAPE
    return None


def check_aux_layer_ids(aux: list[int], num_hidden_layers: int, source: str) -> None:
    """Aux layer ids a target of this depth has: distinct, within 1..n-1 (n is added as the last)."""
    n = num_hidden_layers
    bad = [i for i in aux if not 1 <= int(i) < n]
    if bad or len(set(aux)) != len(aux):
        raise ConfigError(
            f"hidden_states.layer_ids = {list(aux)}: {f'{bad} out of range' if bad else 'ids repeat'}; the target has {n} layers "
            f"({source}), so aux layer ids are distinct and lie within 1..{n - 1} (the last layer, "
            f"{n}, is always captured as well)"
        )


def check_draft_vocab(draft_vocab_size: int, target_vocab_size: int, source: str) -> None:
    if draft_vocab_size > target_vocab_size:
        raise ConfigError(
            f"vocab.draft_vocab_size = {draft_vocab_size} is larger than the target's vocabulary of "
            f"{target_vocab_size} tokens ({source}); set it to at most {target_vocab_size}"
        )


def check_rows_for_shards(rows: int, shards: int, where: str) -> None:
    """More extraction jobs than dataset rows is a config mistake, found once rows are known."""
    if shards > rows:
        raise ConfigError(
            f"hidden_states.shards = {shards} but {where} has only {rows} conversations, so "
            f"{shards - rows} shard(s) would be empty; set hidden_states.shards to at most {rows}"
        )
