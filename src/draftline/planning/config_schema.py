"""The config schema (`config/schema/config.schema.yaml`) as the one source of defaults: the
settings dataclasses of the stages take theirs from here, so a default is written once."""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema" / "config.schema.yaml"


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


class CommandLineError(ValueError):
    """A `--config` value that is not of its key's type; the message names the key."""


def _subschema(schema: dict | None, key: str) -> dict | None:
    """The schema of `key` inside an object `schema` (through a oneOf's object alternative); None
    when the schema does not say (an open mapping such as vllm.engine_args)."""
    if not isinstance(schema, dict):
        return None
    for alternative in [schema, *schema.get("oneOf", []), *schema.get("anyOf", [])]:
        if key in (alternative.get("properties") or {}):
            return alternative["properties"][key]
        extra = alternative.get("additionalProperties")
        if isinstance(extra, dict):
            return extra
    return None


def _typed(value):
    """A value from Snakemake's --config parser as YAML reads it: that parser hands nested values
    over as strings ({"max_seq_len": 512} -> {"max_seq_len": "512"})."""
    import yaml

    if isinstance(value, str):
        for parse in (int, float):  # YAML 1.1 reads 3e-4 as a string
            try:
                return parse(value)
            except ValueError:
                pass
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    return value


def _types(schema: dict) -> str:
    kinds = [schema.get("type")] + [a.get("type") for a in schema.get("oneOf", [])]
    names = [t for kind in kinds if kind for t in (kind if isinstance(kind, list) else [kind])]
    return " or ".join(dict.fromkeys(names)) or "what the schema describes"


def _coerce(value, schema: dict | None, key: str):
    import jsonschema

    if isinstance(value, dict) and not (schema or {}).get("enum"):
        return {k: _coerce(v, _subschema(schema, k), f"{key}.{k}") for k, v in value.items()}
    typed = _typed(value)
    if schema is None:
        return typed
    validator = jsonschema.Draft202012Validator(schema)
    candidates = [typed, value, *([str(value)] if not isinstance(value, (str, list, dict)) else [])]
    for candidate in candidates:
        if validator.is_valid(candidate):
            return candidate
    reason = min(validator.iter_errors(typed), key=lambda e: len(e.path)).message
    raise CommandLineError(
        f"--config {key}: {value!r} is not a valid {key} (the schema's type: {_types(schema)}; {reason}); "
        f"config/schema/config.schema.yaml describes it (docs/configuration.md, \"From the command line\")"
    )


def command_line_config(config: dict, given) -> None:
    """Put the `--config` values (`given`: Snakemake's parsed --config, a profile's `config:`
    included) into `config` as the schema's types, in place: Snakemake reads a top-level value as a
    number, bool or YAML of strings, so `tokenize={"max_seq_len": 512}` arrives as the string "512".
    A value that is none of its key's types is a CommandLineError naming the key. Keys the schema
    does not know are left for the validation to name."""
    schema = _schema()
    for key, value in dict(given).items():
        sub = _subschema(schema, key)
        if sub is None:
            continue
        coerced = _coerce(value, sub, key)
        if isinstance(coerced, dict) and isinstance(config.get(key), dict):
            _merge(config[key], coerced)
        else:
            config[key] = coerced


def _merge(into: dict, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


_DOTTED = re.compile(r"([A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+)=(.*)", re.DOTALL)


def rewrite_config_args(args: list[str]) -> list[str]:
    """A snakemake command line with `--config` values of the dotted form (`train.lr=3e-4`), which
    Snakemake 9.27.1's own parser refuses ("Config entry must start with a valid identifier"), in
    the block form it takes (`train={"lr": "3e-4"}`); dotted keys under one top-level key become
    one block, in the place of the first. A --config list ends at the next word starting with `-`.
    Values stay strings: command_line_config reads each as its key's type in the schema."""
    import json

    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i].startswith("--config="):  # one value, in the same word
            out += [f"--config={v}" for v in rewrite_config_args(["--config", args[i].split("=", 1)[1]])[1:]]
            i += 1
            continue
        out.append(args[i])
        if args[i] not in ("--config", "-C"):
            i += 1
            continue
        i += 1
        blocks: dict[str, dict] = {}
        values: list = []
        while i < len(args) and not args[i].startswith("-"):
            match = _DOTTED.fullmatch(args[i])
            if match is None:
                values.append(args[i])
            else:
                top, *path = match.group(1).split(".")
                if top not in blocks:
                    blocks[top] = {}
                    values.append(top)  # its place among the values
                _set_dotted(blocks[top], top, path, match.group(2))
            i += 1
        out += [f"{v}={json.dumps(blocks[v])}" if v in blocks else v for v in values]
    return out


def _set_dotted(block: dict, top: str, path: list[str], value: str) -> None:
    for n, key in enumerate(path[:-1]):
        block = block.setdefault(key, {})
        if not isinstance(block, dict):
            raise CommandLineError(f"--config {top}.{'.'.join(path)}: {top}.{'.'.join(path[:n + 1])} is given a value too")
    if isinstance(block.get(path[-1]), dict):
        raise CommandLineError(f"--config {top}.{'.'.join(path)}: keys below it are given too")
    block[path[-1]] = value


def validation_error(error, given) -> str | None:
    """What to say for Snakemake's "Error validating config file" when the key at fault came
    from `--config` (`given`), or None when it came from a config file."""
    import jsonschema

    cause = error.__context__  # snakemake.utils.validate raises while handling jsonschema's error
    if not isinstance(cause, jsonschema.ValidationError):
        return None
    path = [str(p) for p in cause.absolute_path]
    level = dict(given)
    for part in path:
        if not isinstance(level, dict) or part not in level:
            return None
        level = level[part]
    if cause.validator == "additionalProperties" and not any(f"'{k}'" in cause.message for k in level):
        return None  # the unknown key is a config file's
    where = ".".join(path) or "the top level"
    return (f"Error validating the command line's --config (or a profile's config:) at {where}: {cause.message}; "
            "config/schema/config.schema.yaml describes every key (docs/configuration.md, \"From the command line\")")


# ---------------------------------------------------------------- docs/configuration.md's table

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
        default = _lookup(_schema(), key, schema=True)
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
    import sys

    if sys.argv[1:2] == ["--rewrite-args"]:  # ./draftline: the command's words, NUL-separated
        try:
            sys.stdout.write("".join(arg + "\0" for arg in rewrite_config_args(sys.argv[2:])))
        except CommandLineError as error:
            sys.exit(f"draftline: {error}")
    else:  # rewrite the page's defaults: PYTHONPATH=src python -m draftline.planning.config_schema
        import yaml

        from draftline.runtime.atomic import atomic_file

        page = settings_page(DOCS_PAGE.read_text(), yaml.safe_load(CONFIG.read_text()))
        with atomic_file(DOCS_PAGE) as out:
            out.write(page)
