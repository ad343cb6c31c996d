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
