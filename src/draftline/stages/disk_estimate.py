"""How much disk the hidden states will take, known before extraction starts.

Each token stores `n_layers x hidden_size` values in the extraction dtype plus its token id
(int64), and each file a small safetensors header: for SmolLM2 (4 layers x 576, float32)
9,224 bytes/token, 645 MB for 70k tokens (measured: 9,225 bytes/token). `hidden_states.format:
fp8` stores one byte per value plus a float32 scale per token (2,316 bytes/token for SmolLM2);
`hidden_states.mode: online` keeps only the samples in flight (`online_working_set`).

The plan (`plan_lines`, printed by rules/common.smk before any job runs) shows each stage's
expected disk use: from the tokenized summary once it exists, before that an upper bound from
the training prompt count x tokenize.max_seq_len. `check_limit` stops an offline run above
hidden_states.max_disk_gb and names the settings that would make it fit, with their sizes.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from draftline.runtime.atomic import atomic_file
from draftline.settings import DEFAULTS, DraftlineConfig, HiddenStateFormat

log = logging.getLogger(__name__)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TOKEN_ID_BYTES = 8  # token_ids are saved as int64 beside the states
FILE_HEADER_BYTES = 160  # safetensors header of one hs_<i> file (two tensors), measured: 152-160
FP8_VALUE_BYTES, FP8_SCALE_BYTES = 1, 4  # format fp8: float8_e4m3fn values, one float32 scale per token
FP8_FILE_HEADER_BYTES = 240  # three tensors (states, scales, token ids)
TOKENIZED_BYTES_PER_TOKEN = 16  # input_ids and loss_mask, int64 each, in the arrow dataset
ONLINE_BATCHES_IN_FLIGHT = 2  # mode online: about this many batches of states exist at once


class DiskLimitError(ValueError):
    """The hidden states would exceed hidden_states.max_disk_gb."""


@dataclass(frozen=True)
class DiskLimit:
    """hidden_states.max_disk_gb (None: no limit) and the lengths its error names for the settings
    that would fit. Passed to the estimate's job as a param object, which Snakemake does not
    compare: a new limit re-extracts nothing (the plan holds an existing estimate to it), and the
    lengths decide no estimate."""

    max_disk_gb: float | None = None
    max_seq_len: int | None = None  # tokenize.max_seq_len
    total_seq_len: int | None = None  # train.total_seq_len: hidden_states.mode online's working set

    @classmethod
    def from_config(cls, config: DraftlineConfig) -> DiskLimit:
        return cls(max_disk_gb=config.hidden_states.max_disk_gb, max_seq_len=config.tokenize.max_seq_len,
                   total_seq_len=config.train.total_seq_len)


def bytes_per_token(hidden_size: int, n_layers: int, dtype: str, format: HiddenStateFormat = DEFAULTS.hidden_states.format) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    if format == "fp8":
        return n_layers * hidden_size * FP8_VALUE_BYTES + FP8_SCALE_BYTES + TOKEN_ID_BYTES
    return n_layers * hidden_size * DTYPE_BYTES[dtype] + TOKEN_ID_BYTES


def estimate(tokens: int, rows: int, hidden_size: int, n_layers: int, dtype: str,
             format: HiddenStateFormat = DEFAULTS.hidden_states.format) -> dict:
    per_token = bytes_per_token(hidden_size, n_layers, dtype, format)
    header = FP8_FILE_HEADER_BYTES if format == "fp8" else FILE_HEADER_BYTES
    total = tokens * per_token + rows * header
    return {
        "rows": rows,
        "tokens": tokens,
        "hidden_size": hidden_size,
        "layers": n_layers,
        "dtype": dtype,
        "format": format,
        "bytes_per_token": per_token,
        "bytes": total,
        "gb": round(total / 1e9, 3),
    }


def _with(est: dict, **changes) -> dict:
    """The estimate with other tokens/rows/format (the same target and layers)."""
    args = {k: est[k] for k in ("tokens", "rows", "hidden_size", "layers", "dtype")}
    args["format"] = est["format"]
    args.update(changes)
    return estimate(args["tokens"], args["rows"], args["hidden_size"], args["layers"], args["dtype"], args["format"])


def online_working_set(est: dict, total_seq_len: int) -> int:
    """hidden_states.mode online: bytes of states on disk at once (the server writes each sample's
    file in the extraction dtype; the Trainer deletes it once loaded), about
    ONLINE_BATCHES_IN_FLIGHT batches of train.total_seq_len tokens."""
    full = _with(est, format="full")
    return ONLINE_BATCHES_IN_FLIGHT * total_seq_len * full["bytes_per_token"]


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.1f} MB"


def describe(est: dict) -> str:
    what = (f"{est['layers']} layers x {est['hidden_size']} x 1 byte fp8 + a float32 scale + token id"
            if est.get("format") == "fp8" else
            f"{est['layers']} layers x {est['hidden_size']} x {est['dtype']} + token id")
    bound = "at most " if est.get("upper_bound") else "~"
    return (
        f"hidden states will take {bound}{est['bytes'] / 1e9:.2f} GB: {est['tokens']:,} tokens x "
        f"{est['bytes_per_token']:,} bytes/token ({what}), {est['rows']:,} files"
    )


def tokens_at_max_seq_len(lengths: list[int], max_seq_len: int) -> int:
    return sum(min(n, max_seq_len) for n in lengths)


def fitting_settings(est: dict, limit_bytes: float, *, lengths: list[int] | None = None,
                     max_seq_len: int | None = None, total_seq_len: int | None = None) -> list[str]:
    """The single settings that each bring the hidden states under `limit_bytes`, with the size
    each gives. `lengths` (the rows' token counts) makes the max_seq_len figure exact; without
    them it assumes every row fills max_seq_len (an upper bound)."""
    out = []
    if est["format"] != "fp8":
        fp8 = _with(est, format="fp8")
        fits = "fits" if fp8["bytes"] <= limit_bytes else "still above"
        out.append(f"hidden_states.format: fp8 -> {_gb(fp8['bytes'])} ({fits})")
    if total_seq_len:
        out.append(f"hidden_states.mode: online -> ~{_gb(online_working_set(est, total_seq_len))} working set "
                   "(nothing kept; the target's forward pass reruns every epoch)")
    per_row = est["bytes"] / max(est["rows"], 1)
    rows = int(limit_bytes // per_row) if per_row else est["rows"]
    if 0 < rows < est["rows"]:
        out.append(f"prompts.max_samples: {rows} -> ~{_gb(rows * per_row)} (rows of average length)")
    header = est["bytes"] - est["tokens"] * est["bytes_per_token"]
    budget_tokens = (limit_bytes - header) // est["bytes_per_token"]
    if lengths:
        lo, hi = 1, max(lengths)
        while lo < hi:  # the longest max_seq_len whose cut rows fit
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if tokens_at_max_seq_len(lengths, mid) <= budget_tokens else (lo, mid - 1)
        cut = lo
        size = tokens_at_max_seq_len(lengths, cut) * est["bytes_per_token"] + header
    else:
        cut = int(budget_tokens // max(est["rows"], 1))
        size = cut * est["rows"] * est["bytes_per_token"] + header
    if cut >= 1 and (max_seq_len is None or cut < max_seq_len):
        out.append(f"tokenize.max_seq_len: {cut} -> {'' if lengths else 'at most '}{_gb(size)}")
    return out


def check_limit(est: dict, max_disk_gb: float | None, *, lengths: list[int] | None = None,
                max_seq_len: int | None = None, total_seq_len: int | None = None) -> None:
    """Stop before extraction when the estimate exceeds the configured limit (None = no limit),
    naming the settings that would make it fit and the size each gives."""
    if max_disk_gb is not None and est["bytes"] > max_disk_gb * 1e9:
        options = fitting_settings(est, max_disk_gb * 1e9, lengths=lengths, max_seq_len=max_seq_len,
                                   total_seq_len=total_seq_len)
        raise DiskLimitError(
            f"hidden_states.max_disk_gb = {max_disk_gb}: the {describe(est)}, above the limit. "
            "Settings that fit (each alone): " + "; ".join(options)
            + "; or raise hidden_states.max_disk_gb, or use fewer hidden_states.layer_ids"
        )


@dataclass(frozen=True)
class Extraction:
    """What the estimate sizes: the extraction's dtype ("auto" resolved as extraction resolves it
    on this machine: float32 without CUDA, so on a cluster whose GPU nodes extract in bfloat16 the
    estimate is an upper bound), its shard count (checked against the rows) and file format."""

    dtype: str
    shards: int
    format: HiddenStateFormat = DEFAULTS.hidden_states.format


def write_estimate(
    tokenized_summary: str | Path,
    layer_ids: str | Path,
    target_dir: str | Path,
    out_path: str | Path,
    extraction: Extraction,
    limit: DiskLimit = DiskLimit(),
    dataset_dir: str | Path | None = None,
) -> dict:
    """Estimate the hidden states' disk use from the tokenized data; check shards and the limit.
    `dataset_dir` (the tokenized dataset) gives the rows' lengths, so the max_seq_len that would
    fit under the limit is exact."""
    dtype, shards, format = extraction.dtype, extraction.shards, extraction.format
    max_disk_gb = limit.max_disk_gb
    from draftline.runtime.vllm_engine import default_dtype
    from draftline.settings.target_shape import check_rows_for_shards, shape_from_config

    summary = json.loads(Path(tokenized_summary).read_text())
    extracted = json.loads(Path(layer_ids).read_text())["extracted"]
    shape = shape_from_config(Path(target_dir) / "config.json")
    check_rows_for_shards(int(summary["rows"]), shards, f"the tokenized dataset ({tokenized_summary})")
    est = estimate(int(summary["total_tokens"]), int(summary["rows"]), shape.hidden_size,
                   len(extracted), default_dtype(dtype), format)
    est["shards"] = shards
    est["max_disk_gb"] = max_disk_gb
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out_path.parent).free
    log.info("%s; %.2f GB free in %s", describe(est), free / 1e9, out_path.parent)
    if est["bytes"] > free:
        log.warning("the hidden states (%.2f GB) will not fit in the %.2f GB free in %s",
                    est["bytes"] / 1e9, free / 1e9, out_path.parent)
    lengths = row_lengths(dataset_dir) if dataset_dir is not None else None
    check_limit(est, max_disk_gb, lengths=lengths, max_seq_len=limit.max_seq_len, total_seq_len=limit.total_seq_len)
    with atomic_file(out_path) as f:
        json.dump(est, f, indent=1)
        f.write("\n")
    return est


def parse_time_estimate(
    tokenized_summary: str | Path, hidden_size: int, n_layers: int, dtype: str,
    format: HiddenStateFormat = DEFAULTS.hidden_states.format,
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
    return estimate(tokens, rows, hidden_size, n_layers, "float32" if dtype == "auto" else dtype, format)


def row_lengths(dataset_dir: str | Path) -> list[int] | None:
    """The tokenized rows' lengths (`seq_len`) read straight from the dataset's arrow files
    (import-light for the Snakefile: milliseconds); None when they cannot be read."""
    try:
        import pyarrow as pa

        lengths: list[int] = []
        for f in sorted(Path(dataset_dir).glob("data-*.arrow")):
            with pa.memory_map(str(f)) as src:
                lengths += pa.ipc.open_stream(src).read_all().column("seq_len").to_pylist()
        return [int(n) for n in lengths] or None
    except Exception:  # a partial or foreign dataset: the estimate falls back to an upper bound
        return None


def upper_bound_estimate(rows: int, max_seq_len: int, hidden_size: int, n_layers: int, dtype: str,
                         format: HiddenStateFormat = DEFAULTS.hidden_states.format) -> dict:
    """Before tokenization: every training row filling tokenize.max_seq_len."""
    est = estimate(rows * max_seq_len, rows, hidden_size, n_layers, "float32" if dtype == "auto" else dtype, format)
    est["upper_bound"] = True
    return est


def plan_lines(est: dict, *, mode: str = "offline", total_seq_len: int | None, source: str,
               release_after_training: bool = False) -> list[str]:
    """The dry run's table: each stage's expected disk use for the chosen format and mode."""
    bound = "at most " if est.get("upper_bound") else "~"
    lines = [f"expected disk use (hidden_states.format {est['format']}, mode {mode}; {source}):",
             f"  tokenized data       {bound}{_gb(est['tokens'] * TOKENIZED_BYTES_PER_TOKEN)}"]
    if mode == "online":
        lines.append(f"  hidden states        ~{_gb(online_working_set(est, total_seq_len))} working set "
                     f"during training (offline would keep {bound}{_gb(est['bytes'])})")
    else:
        released = ", deleted once training has read them" if release_after_training else ""
        lines.append(f"  hidden-state shards  {describe(est).removeprefix('hidden states will take ')}{released}")
        lines.append("  training view        links only")
    lines.append("  checkpoints          the draft's weights + optimizer state per kept epoch (independent of the data)")
    return lines
