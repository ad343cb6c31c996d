"""Snakemake's `--config` read as the models type it: the dotted form (`train.lr=3e-4`) rewritten
into the block form Snakemake takes (./draftline calls `rewrite_config_args`), each value read as
its key's type (`command_line_config`), and a validation error about a --config key said to be the
command line's (`validation_error`)."""

from __future__ import annotations

import re

from draftline.settings.schema import config_schema


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
    schema = config_schema()
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
    Values stay strings: command_line_config reads each as its key's type in the schema. A dotted
    key the settings models do not have stops here, naming it and the keys its block has."""
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
                check_dotted_key(top, path)
                if top not in blocks:
                    blocks[top] = {}
                    values.append(top)  # its place among the values
                _set_dotted(blocks[top], top, path, match.group(2))
            i += 1
        out += [f"{v}={json.dumps(blocks[v])}" if v in blocks else v for v in values]
    return out


def check_dotted_key(top: str, path: list[str]) -> None:
    """`top.path` names a setting of the models (draftline.settings), or a key inside an open
    mapping of them (vllm.engine_args.block_size, evaluate.prompt_sets.code); else a
    CommandLineError naming the first part they do not have and the keys there are."""
    import typing

    from pydantic import BaseModel

    from draftline.settings.config import DraftlineConfig

    model: type[BaseModel] = DraftlineConfig
    parts = [top, *path]
    for n, part in enumerate(parts):
        field = model.model_fields.get(part)
        where = ".".join(parts[:n]) or "the config's top level"
        if field is None:
            raise CommandLineError(
                f"--config {'.'.join(parts)}: {where} has no key {part!r} (its keys: {', '.join(model.model_fields)}); "
                "config/schema/config.schema.yaml describes every key (docs/configuration.md, \"From the command line\")"
            )
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            continue
        if n < len(parts) - 1 and typing.get_origin(annotation) is not dict:
            raise CommandLineError(f"--config {'.'.join(parts)}: {'.'.join(parts[:n + 1])} is a setting, with no keys below it")
        return


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


if __name__ == "__main__":  # ./draftline --rewrite-args WORDS: the command's words, NUL-separated
    import sys

    try:
        sys.stdout.write("".join(arg + "\0" for arg in rewrite_config_args(sys.argv[2:])))
    except CommandLineError as error:
        sys.exit(f"draftline: {error}")
