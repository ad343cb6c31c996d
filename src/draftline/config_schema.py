"""The config schema (`config/schema/config.schema.yaml`) as the one source of defaults: the
settings dataclasses of the stages take theirs from here, so a default is written once."""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[2] / "config" / "schema" / "config.schema.yaml"


@lru_cache(maxsize=1)
def _schema() -> dict:
    import yaml

    return yaml.safe_load(SCHEMA.read_text())


def default(block: str, key: str):
    """The schema's default of `block.key` (e.g. default("train", "epochs") -> 3)."""
    try:
        return copy.deepcopy(_schema()["properties"][block]["properties"][key]["default"])
    except KeyError:
        raise KeyError(f"{SCHEMA}: no default for {block}.{key}") from None


CHANGES_OUTPUTS = "x-changes-outputs"


def output_changing(block: str) -> tuple[str, ...]:
    """The keys of `block` the schema marks `x-changes-outputs: true` (a change can change what a
    stage produces, so it decides staleness), in the schema's order. Every key of a block that uses
    the mark must carry it, true or false: a new setting is decided, never forgotten."""
    properties = _schema()["properties"][block]["properties"]
    undecided = [key for key, spec in properties.items() if CHANGES_OUTPUTS not in spec]
    if undecided:
        raise KeyError(f"{SCHEMA}: {block}.{', '.join(undecided)} carries no {CHANGES_OUTPUTS} (true or false)")
    return tuple(key for key, spec in properties.items() if spec[CHANGES_OUTPUTS] is True)
