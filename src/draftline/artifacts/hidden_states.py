"""Hidden-state files and shard folders: `results/hidden_states/shard_<k>/hs_<row>.safetensors`
with the shard's `manifest.json`, and the training view `results/hidden_states/all/`.

Row i's file holds `hidden_states` [seq_len, len(extracted), hidden] (the aux layers, then the
last layer) and `token_ids` [seq_len]: the layout speculators' Trainer reads
(`speculators.train.data`). Two formats (`hidden_states.format`, recorded in every manifest):

- `full`: `hidden_states` in the extraction dtype (float32 on CPU, bfloat16 on CUDA), read by
  speculators' `--hidden-states-backend file`;
- `fp8`: speculators' own FP8 layout (`hs_connectors.fp8_hidden_states_connector`):
  `hidden_states` float8_e4m3fn plus `hidden_states_scales` float32 [seq_len, 1, 1] (one scale
  per token), read by `--hidden-states-backend fp8` (`hs_connectors.transfer.FP8Transfer`).

Every backend writes files that `validate_hidden_state_file` accepts; extraction, the view and
training read shards through `read_manifest`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftline.settings import DEFAULTS, HiddenStateFormat

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"  # in every published shard and in the view
STAGING_KEY = "key.json"  # in a staging folder: the settings its files were made with
# speculators' Trainer flag `--hidden-states-backend` that reads each format
TRAINER_BACKEND = {"full": "file", "fp8": "fp8"}
FP8_DTYPE = "float8_e4m3fn"


class HiddenStateFileError(ValueError):
    """A hidden-state file that is missing, unreadable or does not match its dataset row."""


def file_name(row: int) -> str:
    """The name speculators' FileTransfer looks up for dataset row `row`."""
    return f"hs_{row}.safetensors"


def shard_rows(num_rows: int, k: int, n: int) -> range:
    """Rows of shard k of n: contiguous ranges differing by at most one row.

    The same split as speculators' `get_indices_to_process` (the first `num_rows % n`
    shards take one extra row).
    """
    if n < 1 or not 0 <= k < n:
        raise ValueError(f"shard {k} of {n}: need n >= 1 and 0 <= k < n")
    size, extra = divmod(num_rows, n)
    start = k * size + min(k, extra)
    return range(start, start + size + (1 if k < extra else 0))


def validate_hidden_state_file(
    path: str | Path,
    input_ids: Sequence[int],
    n_layers: int,
    hidden_size: int,
    *,
    row: int | None = None,
    dtype: str | None = None,
    format: HiddenStateFormat = DEFAULTS.hidden_states.format,
) -> int:
    """Check one file against its dataset row; return its token count.

    Raises HiddenStateFileError naming the file and row when the file is missing or cannot
    be opened (a truncated write counts as missing), when its token ids differ from the row's
    input_ids, or when the shape, dtype or values (NaN/inf) are wrong. `dtype` is the stored
    dtype of a `full` file; an `fp8` file must hold float8_e4m3fn states and finite positive
    per-token scales, and is checked for finite values after dequantization (speculators' own
    `dequantize_fp8_tensor`, as its reader does).
    """
    import torch
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states

    where = f"{path} (dataset row {row})" if row is not None else str(path)
    try:
        data = load_file(str(path))
    except FileNotFoundError:
        raise HiddenStateFileError(f"{where}: file is missing") from None
    except Exception as e:  # safetensors raises its own error types for a bad header/size
        raise HiddenStateFileError(f"{where}: cannot be opened ({e}); delete it and rerun") from e
    hs = data.get("hidden_states")
    if isinstance(hs, torch.Tensor) and hs.ndim != 3:
        raise HiddenStateFileError(
            f"{where}: hidden_states has shape {tuple(hs.shape)}, expected [seq_len, layers, hidden]"
        )
    tokens = [int(t) for t in input_ids]
    if format == "fp8":
        data = _dequantized(data, where)
    elif "hidden_states_scales" in data:
        raise HiddenStateFileError(
            f"{where}: an fp8 file (it has hidden_states_scales) where format full is expected; "
            "it was made with another hidden_states.format: rerun its extraction"
        )
    try:
        # speculators' own check: keys present, token ids equal, length matches, all finite.
        check_hidden_states(data, tokens)
    except ValueError as e:
        got = data.get("token_ids")
        detail = str(e)
        if "Token ids" in detail and got is not None:
            got = got.tolist()
            first = next((j for j, (a, b) in enumerate(zip(got, tokens)) if a != b), min(len(got), len(tokens)))
            detail = (
                f"token ids differ from the dataset row's input_ids ({len(got)} vs {len(tokens)} "
                f"tokens, first difference at position {first}); the file belongs to another dataset"
            )
        raise HiddenStateFileError(f"{where}: {detail}") from None
    if hs.shape[1] != n_layers or hs.shape[2] != hidden_size:
        raise HiddenStateFileError(
            f"{where}: hidden_states has shape {tuple(hs.shape)}, expected "
            f"[{len(tokens)}, {n_layers}, {hidden_size}] ({n_layers} extracted layers)"
        )
    if format == "full" and dtype is not None and hs.dtype != getattr(torch, dtype):
        raise HiddenStateFileError(f"{where}: hidden_states dtype {hs.dtype}, expected {dtype}")
    return len(tokens)


def _dequantized(data: dict, where: str) -> dict:
    """An fp8 file's tensors with `hidden_states` dequantized to float32 (scales checked first)."""
    import torch
    from hs_connectors.fp8_utils import SCALES_KEY, dequantize_fp8_tensor

    hs, scales = data.get("hidden_states"), data.get(SCALES_KEY)
    if hs is None or scales is None:
        raise HiddenStateFileError(
            f"{where}: not an fp8 hidden-state file (no {'hidden_states' if hs is None else SCALES_KEY}); "
            "it was made with another hidden_states.format: rerun its extraction"
        )
    if hs.dtype != getattr(torch, FP8_DTYPE):
        raise HiddenStateFileError(f"{where}: hidden_states dtype {hs.dtype}, expected {FP8_DTYPE} (format fp8)")
    if scales.dtype != torch.float32 or list(scales.shape) != [hs.shape[0], 1, 1]:
        raise HiddenStateFileError(
            f"{where}: {SCALES_KEY} is {scales.dtype} {list(scales.shape)}, expected float32 [{hs.shape[0]}, 1, 1]"
        )
    if not (torch.isfinite(scales).all() and (scales > 0).all()):
        raise HiddenStateFileError(f"{where}: {SCALES_KEY} holds non-finite or non-positive scales")
    out = {k: v for k, v in data.items() if k != SCALES_KEY}
    out["hidden_states"] = dequantize_fp8_tensor(hs, scales, dtype=torch.float32)
    return out


def write_manifest(folder: str | Path, manifest: dict) -> None:
    (Path(folder) / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def read_states(path: str | Path, format: HiddenStateFormat = DEFAULTS.hidden_states.format):
    """A file's `hidden_states` as the Trainer sees them: an fp8 file through speculators' own
    reader (`hs_connectors.transfer.FP8Transfer`, dequantized to bfloat16), cast to float32."""
    import torch
    from hs_connectors.transfer import FP8Transfer
    from safetensors.torch import load_file

    path = Path(path)
    if format == "fp8":
        row = int(path.stem.removeprefix("hs_"))
        return FP8Transfer(path.parent).get_cached(row)["hidden_states"].float()
    return load_file(str(path))["hidden_states"].to(torch.float32)


def relative_error_per_layer(reference, other) -> list[float]:
    """||other - reference|| / ||reference|| for each extracted layer (dim 1, over all tokens):
    how far another format's states are from the full-precision ones."""
    ref, diff = reference.float(), other.float() - reference.float()
    return [float(diff[:, j].norm() / ref[:, j].norm()) for j in range(ref.shape[1])]


def manifest_format(manifest: dict) -> str:
    """The format a shard's or view's manifest records (manifests from before formats: full)."""
    return manifest.get("format", "full")


def read_manifest(folder: str | Path) -> dict:
    """A published shard's (or the view's) manifest; a folder without one is no finished shard."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {folder} is not a finished shard; rerun its extraction")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); delete {folder} and rerun its extraction") from err


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
    format: HiddenStateFormat = DEFAULTS.hidden_states.format,
    remove_bad_shards: bool = False,
) -> int:
    """Check every dataset row's file (open, token ids, shape, dtype, finite); return the tokens.

    Reads every file once (about as long as one training epoch's reads). On failure raises
    HiddenStateFileError naming each bad file and its reason. With `remove_bad_shards` the shard
    folders holding bad files are deleted with the view (`hidden_states_dir`, a folder of links),
    so the next run re-extracts those shards and rebuilds the view, nothing else.
    """
    from datasets import load_from_disk

    folder = Path(hidden_states_dir)
    rows = load_from_disk(str(dataset_dir)).with_format(None)["input_ids"]
    bad: list[BadFile] = []
    tokens = 0
    for row, ids in enumerate(rows):
        path = folder / file_name(row)
        try:
            tokens += validate_hidden_state_file(
                path, ids, n_layers, hidden_size, row=row, dtype=dtype, format=format
            )
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
