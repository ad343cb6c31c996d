"""How much disk the hidden states will take, known before extraction starts.

Each token stores `n_layers x hidden_size` values in the extraction dtype plus its token id
(int64), and each file a small safetensors header: for SmolLM2 (4 layers x 576, float32)
9,224 bytes/token, 645 MB for 70k tokens (measured: 9,225 bytes/token).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from draftline.atomic import atomic_file

log = logging.getLogger(__name__)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TOKEN_ID_BYTES = 8  # token_ids are saved as int64 beside the states
FILE_HEADER_BYTES = 160  # safetensors header of one hs_<i> file (two tensors), measured: 152-160


class DiskLimitError(ValueError):
    """The hidden states would exceed hidden_states.max_disk_gb."""


def bytes_per_token(hidden_size: int, n_layers: int, dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    return n_layers * hidden_size * DTYPE_BYTES[dtype] + TOKEN_ID_BYTES


def estimate(tokens: int, rows: int, hidden_size: int, n_layers: int, dtype: str) -> dict:
    per_token = bytes_per_token(hidden_size, n_layers, dtype)
    total = tokens * per_token + rows * FILE_HEADER_BYTES
    return {
        "rows": rows,
        "tokens": tokens,
        "hidden_size": hidden_size,
        "layers": n_layers,
        "dtype": dtype,
        "bytes_per_token": per_token,
        "bytes": total,
        "gb": round(total / 1e9, 3),
    }


def describe(est: dict) -> str:
    return (
        f"hidden states will take ~{est['bytes'] / 1e9:.2f} GB: {est['tokens']:,} tokens x "
        f"{est['bytes_per_token']:,} bytes/token ({est['layers']} layers x {est['hidden_size']} "
        f"x {est['dtype']} + token id), {est['rows']:,} files"
    )


def check_limit(est: dict, max_disk_gb: float | None) -> None:
    """Stop before extraction when the estimate exceeds the configured limit (None = no limit)."""
    if max_disk_gb is not None and est["bytes"] > max_disk_gb * 1e9:
        raise DiskLimitError(
            f"hidden_states.max_disk_gb = {max_disk_gb}: the {describe(est)}, above the limit; "
            "raise hidden_states.max_disk_gb, or lower prompts.max_samples or tokenize.max_seq_len, "
            "or use fewer hidden_states.layer_ids"
        )


def write_estimate(
    tokenized_summary: str | Path,
    layer_ids: str | Path,
    target_dir: str | Path,
    dtype: str,
    shards: int,
    out_path: str | Path,
    max_disk_gb: float | None = None,
) -> dict:
    """Estimate the hidden states' disk use from the tokenized data; check shards and the limit.

    `dtype` "auto" is resolved as extraction resolves it on this machine (float32 without
    CUDA): on a cluster whose GPU nodes extract in bfloat16 the estimate is then an upper bound.
    """
    from draftline.checks import check_rows_for_shards, shape_from_config
    from draftline.engine import default_dtype

    summary = json.loads(Path(tokenized_summary).read_text())
    extracted = json.loads(Path(layer_ids).read_text())["extracted"]
    shape = shape_from_config(Path(target_dir) / "config.json")
    check_rows_for_shards(int(summary["rows"]), shards, f"the tokenized dataset ({tokenized_summary})")
    est = estimate(int(summary["total_tokens"]), int(summary["rows"]), shape.hidden_size,
                   len(extracted), default_dtype(dtype))
    est["shards"] = shards
    est["max_disk_gb"] = max_disk_gb
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out_path.parent).free
    log.info("%s; %.2f GB free in %s", describe(est), free / 1e9, out_path.parent)
    if est["bytes"] > free:
        log.warning("the hidden states (%.2f GB) will not fit in the %.2f GB free in %s",
                    est["bytes"] / 1e9, free / 1e9, out_path.parent)
    check_limit(est, max_disk_gb)
    with atomic_file(out_path) as f:
        json.dump(est, f, indent=1)
        f.write("\n")
    return est


def parse_time_estimate(
    tokenized_summary: str | Path, hidden_size: int, n_layers: int, dtype: str
) -> dict | None:
    """The estimate from an existing tokenized summary (None when tokenization has not run).

    Import-light for the Snakefile: "auto" counts as float32 (the CPU dtype; half on CUDA).
    """
    path = Path(tokenized_summary)
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
        tokens, rows = int(summary["total_tokens"]), int(summary["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a stale or partial summary: the rule will say more
    return estimate(tokens, rows, hidden_size, n_layers, "float32" if dtype == "auto" else dtype)
