"""The JSON schema of the config, exported from the models (config/schema/config.schema.yaml, which
Snakemake validates against and fills the defaults from), and the defaults and staleness marks
read from the models themselves.

The file is written by `PYTHONPATH=src python -m draftline.settings.export`; tests/test_settings.py
holds it equal to the export. It is inlined (no $ref): Snakemake's defaults filling sets each
`default` it meets under `properties`, and a block behind a reference would be filled only as far
as jsonschema follows it."""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from draftline.settings.config import DraftlineConfig
from draftline.settings.fields import CHANGES_OUTPUTS

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema" / "config.schema.yaml"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
HEADER = (
    "# Written by `PYTHONPATH=src python -m draftline.settings.export` from the models in src/draftline/settings/\n"
    "# (each setting's one default, its description and x-changes-outputs): edit them there, not here.\n"
)
# The order a schema's keys are written in (any others after them).
ORDER = ("$schema", CHANGES_OUTPUTS, "type", "enum", "oneOf", "items", "minItems", "uniqueItems", "minimum", "exclusiveMinimum",
         "maximum", "minLength", "pattern", "not", "default", "additionalProperties", "propertyNames", "description", "properties")


class _Generator(GenerateJsonSchema):
    """pydantic's JSON schema in the plain shapes a reader of the YAML expects: a nullable value as
    `type: [integer, "null"]`, a literal as an `enum`, a union as `oneOf`, a mapping's key rules
    under `propertyNames`, and no titles."""

    def field_title_should_be_set(self, schema) -> bool:
        return False

    def nullable_schema(self, schema):
        inner = self.generate_inner(schema["schema"])
        kind = inner.get("type")
        if isinstance(kind, str) and "enum" not in inner:
            return {**inner, "type": [kind, "null"]}
        if "enum" in inner:
            return {**inner, "type": [kind, "null"]} if kind else {**inner, "enum": [*inner["enum"], None]}
        return {"oneOf": [inner, {"type": "null"}]}

    def literal_schema(self, schema):
        values = [v.value if hasattr(v, "value") else v for v in schema["expected"]]
        kinds = {type(v) for v in values}
        names = {str: "string", int: "integer", float: "number", bool: "boolean"}
        out = {"enum": values}
        if len(kinds) == 1 and next(iter(kinds)) in names:
            out = {"type": names[next(iter(kinds))], **out}
        return out

    def union_schema(self, schema):
        return {"oneOf": [self.generate_inner(choice if not isinstance(choice, tuple) else choice[0])
                          for choice in schema["choices"]]}

    def dict_schema(self, schema):
        out: dict = {"type": "object"}
        values = self.generate_inner(schema["values_schema"]) if "values_schema" in schema else {}
        if values:
            out["additionalProperties"] = values
        keys = self.generate_inner(schema["keys_schema"]) if "keys_schema" in schema else {}
        keys = {k: v for k, v in keys.items() if k != "type"}
        if keys:
            out["propertyNames"] = keys
        return out


def _inline(node, defs: dict):
    """`node` with every $ref replaced by the definition it names (siblings kept), titles dropped,
    descriptions on one line and keys in ORDER."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **siblings}
    out = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "properties":
            out[key] = {name: _inline(spec, defs) for name, spec in value.items()}
        elif key == "description":
            out[key] = " ".join(value.split())
        elif key == "default":
            out[key] = value
        else:
            out[key] = _inline(value, defs)
    rank = {key: n for n, key in enumerate(ORDER)}
    return dict(sorted(out.items(), key=lambda item: rank.get(item[0], len(ORDER))))


def export(model: type[BaseModel] = DraftlineConfig) -> dict:
    """The JSON schema of `model`, inlined."""
    raw = model.model_json_schema(schema_generator=_Generator)
    return _inline({"$schema": DIALECT, **raw}, raw.get("$defs", {}))


@lru_cache(maxsize=1)
def _exported() -> dict:
    return export()


def config_schema() -> dict:
    """The config's JSON schema as the models give it (a copy: the caller may fill it)."""
    return copy.deepcopy(_exported())


def schema_text() -> str:
    """config/schema/config.schema.yaml as the models write it."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = ">" if len(value) > 80 else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    def mapping(dumper, value: dict):  # a setting's schema one key a line; small parts ({type: string}) inline
        return dumper.represent_mapping("tag:yaml.org,2002:map", value, flow_style=False if "description" in value else None)

    Dumper.add_representer(str, text)
    Dumper.add_representer(dict, mapping)
    return HEADER + yaml.dump(export(), Dumper=Dumper, sort_keys=False, width=100, default_flow_style=None,
                              allow_unicode=True)


def _block(block: str) -> type[BaseModel]:
    field = DraftlineConfig.model_fields.get(block)
    annotation = getattr(field, "annotation", None)
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        raise KeyError(f"draftline.settings: no config block {block!r}")
    return annotation


def default(block: str, key: str):
    """The one default of `block.key` (e.g. default("train", "epochs") -> 3), from its model."""
    field = _block(block).model_fields.get(key)
    if field is None:
        raise KeyError(f"draftline.settings: no default for {block}.{key}") from None
    value = field.get_default(call_default_factory=True)
    return value.model_dump() if isinstance(value, BaseModel) else copy.deepcopy(value)


def output_changing(block: str) -> tuple[str, ...]:
    """The keys of `block` marked `changes_outputs=True` (a change can change what a stage
    produces, so it decides staleness), in the block's order. Every key of a block that uses the
    mark must carry it, true or false: a new setting is decided, never forgotten."""
    fields = _block(block).model_fields
    marks = {key: (field.json_schema_extra or {}).get(CHANGES_OUTPUTS) for key, field in fields.items()}
    undecided = [key for key, mark in marks.items() if mark is None]
    if undecided:
        raise KeyError(f"draftline.settings: {block}.{', '.join(undecided)} carries no changes_outputs (true or false)")
    return tuple(key for key, mark in marks.items() if mark is True)
