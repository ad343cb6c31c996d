"""The installed packages' versions, looked up in one place (`importlib.metadata`).

Read by a job's check against the pins it was planned with (draftline.planning.rule_params), by every
provenance.json (draftline.lineage.provenance) and by each hidden-state shard's manifest. A module of its
own that imports nothing of draftline: a stage that records versions hashes only this file into
its `code` param, not the plan or the bookkeeping (whose fixes must rerun no GPU work).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist`; None when it is not installed."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def package_versions(names: tuple[str, ...]) -> dict[str, str]:
    """{name: installed version} for each of `names` that is installed (the others left out)."""
    return {name: found for name in names if (found := installed_version(name)) is not None}
