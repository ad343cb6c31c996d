"""docs/configuration.md's settings table: its defaults column regenerated from the models (and
config/config.yaml's value where that differs); the keys and their meanings are the page's own.
`PYTHONPATH=src python -m draftline.settings.docs_table` rewrites it; tests/test_docs.py checks it."""

from __future__ import annotations

import re

from draftline.settings.schema import SCHEMA, config_schema

DOCS_PAGE = SCHEMA.parents[2] / "docs" / "configuration.md"
CONFIG = SCHEMA.parents[1] / "config.yaml"


def _shown(value) -> str:
    """A value as the settings table shows it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return ", ".join(value) if value else "{}"
    if isinstance(value, list):
        return "`[" + ", ".join(map(str, value)) + "]`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _row_keys(cell: str) -> list[tuple[str, ...]]:
    """The keys a row's first cell names: `block.key`, then `key`s of the same block."""
    keys, block = [], ()
    for name in re.findall(r"`([^`]+)`", cell):
        parts = tuple(name.split("."))
        if len(parts) > 1:
            block = parts[:-1]
        keys.append(parts if len(parts) > 1 else (*block, *parts))
    return keys


def _lookup(tree: dict, key: tuple[str, ...], schema: bool):
    node = tree
    for part in key:
        node = (node.get("properties") or {}).get(part) if schema else node.get(part)
        if node is None:
            return _MISSING
    return node.get("default", _MISSING) if schema else node


_MISSING = object()


def default_cell(cell: str, config: dict) -> str:
    """The defaults column of a settings row: the schema's default of each key, and config.yaml's
    value beside it where that differs (`3 (config.yaml: 4)`)."""
    shown = []
    for key in _row_keys(cell):
        default = _lookup(config_schema(), key, schema=True)
        if default is _MISSING:
            raise KeyError(f"{DOCS_PAGE.name}: {'.'.join(key)} has no default in {SCHEMA.name}")
        text = _shown(default)
        configured = _lookup(config, key, schema=False)
        if configured is not _MISSING and configured != default:
            text += f" (config.yaml: {_shown(configured)})"
        shown.append(text)
    return ", ".join(shown)


def settings_page(text: str, config: dict) -> str:
    """docs/configuration.md with its settings table's defaults column regenerated (the keys and
    their meanings are the page's own)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("| key | default | meaning |"))
    for i in range(start + 2, len(lines)):
        if not lines[i].startswith("| "):
            break
        cells = lines[i].rstrip("\n").split(" | ")
        cells[1] = default_cell(cells[0], config)
        lines[i] = " | ".join(cells) + "\n"
    return "".join(lines)


if __name__ == "__main__":
    import yaml

    DOCS_PAGE.write_text(settings_page(DOCS_PAGE.read_text(), yaml.safe_load(CONFIG.read_text())))
