"""A row's `tools` (OpenAI function schemas, or a JSON string of them) and an assistant turn's
`tool_calls` (or ShareGPT's `function_call` value), validated and normalized."""

from __future__ import annotations

import json
from typing import Any

from draftline.sources.errors import BadRow


def json_field(at: str, value: Any, field_name: str) -> Any:
    """A field that may hold JSON as a string (Hermes' `tools`, OpenAI's `arguments`), decoded."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value) if value.strip() else None
    except json.JSONDecodeError as exc:
        raise BadRow("bad_json_field", f"{at} {field_name} is a string that is not valid JSON ({exc.msg}, column "
                     f"{exc.colno})", f"write {field_name} as JSON, or as the object itself") from None


def _drop_nulls(value: Any) -> Any:
    """Without null-valued keys: Parquet and datasets fill a key absent from one schema with null."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


TOOLS_FIX = "give `tools` as a list of OpenAI function schemas [{type: function, function: {name, description, parameters}}]"


def normalize_tools(tools: Any) -> list[dict] | None:
    """`tools` as OpenAI function schemas (a flat {name, parameters} is wrapped); None when absent."""
    tools = _drop_nulls(json_field("`tools`", tools, "`tools`"))
    if tools in (None, [], {}):
        return None
    if not isinstance(tools, list):
        raise BadRow("bad_tools", f"`tools` is a {type(tools).__name__}, not a list", TOOLS_FIX)
    out, names = [], set()
    for j, tool in enumerate(tools):
        if isinstance(tool, dict) and "function" not in tool and "name" in tool:
            tool = {"type": "function", "function": tool}
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise BadRow("bad_tools", f"`tools[{j}]` is not a function schema", TOOLS_FIX)
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise BadRow("bad_tools", f"`tools[{j}].function.name` is missing", TOOLS_FIX)
        if not isinstance(function.get("parameters", {}), dict):
            raise BadRow("bad_tools", f"`tools[{j}].function.parameters` is not an object (a JSON schema)", TOOLS_FIX)
        if name in names:
            raise BadRow("bad_tools", f"`tools[{j}]` declares {name!r} a second time", "declare each function once")
        names.add(name)
        out.append({**tool, "type": "function"})
    return out


def tool_calls(at: str, calls: Any, tool_names: set[str] | None) -> list[dict]:
    """An assistant turn's calls as [{id?, type: function, function: {name, arguments: {...}}}]."""
    calls = _drop_nulls(json_field(at, calls, "tool_calls"))
    if not isinstance(calls, list) or not calls:
        raise BadRow("bad_tool_call", f"{at} is not a list of calls", "give tool_calls as [{id, type, function: "
                     "{name, arguments}}], or leave it out")
    out = []
    for j, call in enumerate(calls):
        where_ = f"{at}[{j}]" if at.endswith("tool_calls") else at
        function = call.get("function", call) if isinstance(call, dict) else None  # flat {name, arguments} too
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise BadRow("bad_tool_call", f"{where_} has no function.name", "name the function each call calls")
        arguments = json_field(f"{where_}.function.arguments", function.get("arguments"), "the arguments")
        if not isinstance(arguments, dict | None):
            raise BadRow("bad_tool_call", f"{where_}.function.arguments is a {type(arguments).__name__}, not an object",
                         "give a call's arguments as a JSON object")
        if tool_names is None or name not in tool_names:
            declared = f"its `tools` declare {sorted(tool_names)}" if tool_names else "it has no `tools`"
            raise BadRow("unknown_tool", f"{where_} calls {name!r}, but {declared}",
                         "give the row the `tools` its calls use, or correct the call's name")
        entry = {"type": "function", "function": {"name": name, "arguments": arguments or {}}}
        if isinstance(call, dict) and call.get("id") is not None:
            entry = {"id": str(call["id"]), **entry}
        out.append(entry)
    return out

