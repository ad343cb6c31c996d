"""Checks that stop a run early: the config against the target's shape (at parse time), and
every hidden-state file against its dataset row (before training).

The parse-time part is import-light (json only): the Snakefile calls `check_config` before any
job is planned, so a layer id, vocabulary or sequence length the target cannot serve fails in
a second with the config key named, not hours later inside a GPU job.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config value the target (or the data) cannot serve; the message names the key."""


@dataclass(frozen=True)
class TargetShape:
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    source: str  # where the numbers come from, for messages


# SmolLM2-135M-Instruct as materialized from the packaged GGUF (resources/target/.../config.json);
# known before the target_model job has written the folder.
EMBEDDED_SHAPE = TargetShape(
    num_hidden_layers=30, hidden_size=576, vocab_size=49152, max_position_embeddings=8192,
    source="the embedded SmolLM2-135M-Instruct",
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
    return TargetShape(
        int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text["vocab_size"]),
        int(max_pos) if max_pos else None, str(path),
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


def check_config(config: dict, shape: TargetShape | None) -> None:
    """Config values the target cannot serve, or that cannot work for the data; one ConfigError.

    Only what is knowable from the config and the target's config.json: the rest (rows left
    after tokenization) is checked by the disk_estimate rule before extraction.
    """
    hs = config["hidden_states"]
    shards, max_samples = hs["shards"], config["prompts"]["max_samples"]
    if max_samples is not None and shards > max_samples:
        raise ConfigError(
            f"hidden_states.shards = {shards} is more than prompts.max_samples = {max_samples} "
            "training conversations, so some shards would have no rows; lower hidden_states.shards"
        )
    if shape is None:
        return
    n = shape.num_hidden_layers
    if hs["layer_ids"] != "auto":
        bad = [i for i in hs["layer_ids"] if not 1 <= int(i) < n]
        if bad:
            raise ConfigError(
                f"hidden_states.layer_ids = {list(hs['layer_ids'])}: {bad} out of range; the target "
                f"has {n} layers ({shape.source}), so aux layer ids lie within 1..{n - 1} (the last "
                f"layer, {n}, is always captured as well)"
            )
    draft_vocab = config["vocab"]["draft_vocab_size"]
    if draft_vocab > shape.vocab_size:
        raise ConfigError(
            f"vocab.draft_vocab_size = {draft_vocab} is larger than the target's vocabulary of "
            f"{shape.vocab_size} tokens ({shape.source}); set it to at most {shape.vocab_size}"
        )
    max_seq_len = config["tokenize"]["max_seq_len"]
    if shape.max_position_embeddings and max_seq_len > shape.max_position_embeddings:
        raise ConfigError(
            f"tokenize.max_seq_len = {max_seq_len} is above the target's maximum of "
            f"{shape.max_position_embeddings} positions (max_position_embeddings in "
            f"{shape.source}); set it to at most {shape.max_position_embeddings}"
        )


def check_rows_for_shards(rows: int, shards: int, where: str) -> None:
    """More extraction jobs than dataset rows is a config mistake, found once rows are known."""
    if shards > rows:
        raise ConfigError(
            f"hidden_states.shards = {shards} but {where} has only {rows} conversations, so "
            f"{shards - rows} shard(s) would be empty; set hidden_states.shards to at most {rows}"
        )


# --- hidden-state files before training ---------------------------------------------------


@dataclass(frozen=True)
class BadFile:
    row: int
    path: Path
    shard: Path | None  # the published shard folder holding it (the link's target's folder)
    reason: str


def validate_hidden_states(
    dataset_dir: str | Path,
    hidden_states_dir: str | Path,
    n_layers: int,
    hidden_size: int,
    *,
    dtype: str | None = None,
    remove_bad_shards: bool = False,
) -> int:
    """Check every dataset row's file (open, token ids, shape, dtype, finite); return the tokens.

    Reads every file once (about as long as one training epoch's reads). On failure raises
    HiddenStateFileError naming each bad file and its reason. With `remove_bad_shards` the shard
    folders holding bad files are deleted with the view (`hidden_states_dir`, a folder of links),
    so the next run re-extracts those shards and rebuilds the view, nothing else.
    """
    from datasets import load_from_disk

    from draftline.hidden_states import HiddenStateFileError, file_name, validate_hidden_state_file

    folder = Path(hidden_states_dir)
    rows = load_from_disk(str(dataset_dir)).with_format(None)["input_ids"]
    bad: list[BadFile] = []
    tokens = 0
    for row, ids in enumerate(rows):
        path = folder / file_name(row)
        try:
            tokens += validate_hidden_state_file(path, ids, n_layers, hidden_size, row=row, dtype=dtype)
        except HiddenStateFileError as err:
            shard = Path(os.path.realpath(path)).parent if path.is_symlink() else None
            bad.append(BadFile(row, path, shard, str(err)))
    if not bad:
        log.info("%s: %d files, %d tokens, all valid", folder, len(rows), tokens)
        return tokens
    shards = sorted({b.shard for b in bad if b.shard is not None})
    if remove_bad_shards and shards:
        # The view goes too: Snakemake does not rebuild a missing input of an existing output,
        # so with the view gone the next run plans the view and the removed shards only.
        for removed in [*shards, folder]:
            shutil.rmtree(removed, ignore_errors=True)
    first = "; ".join(b.reason for b in bad[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    if shards and remove_bad_shards:
        fix = (f"removed {', '.join(map(str, shards))} and the view {folder}; run the workflow "
               "again to re-extract only those shards")
    elif shards:
        fix = (f"delete {', '.join(map(str, shards))} and the view {folder}, then run the workflow "
               "again to re-extract only those shards")
    else:
        fix = "rerun the hidden_states steps"
    raise HiddenStateFileError(
        f"{len(bad)} of {len(rows)} hidden-state files are unusable: {first}{more}; {fix}"
    )
