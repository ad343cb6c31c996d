"""A row in any of the three shapes (OpenAI `messages` [{role, content}], ShareGPT
`conversations` [{from, value}], a plain `prompt` with optional `system` and
`response`/`completion`) as validated `messages` (+ `tools`), and its id.

An assistant turn keeps its `tool_calls` (ShareGPT: a `function_call` turn) and its thinking
(`reasoning_content`, `reasoning` or `thinking`); a tool result (ShareGPT: `observation`) its
`tool_call_id` and `name`. `conversation_id` hashes only the normalized conversation, so one
conversation has one id whatever its source or format.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from draftline.sources.errors import BadRow
from draftline.sources.tools import json_field, normalize_tools, tool_calls
from draftline.sources.turn_order import validate_order

ROLES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "tool": "tool",
    "observation": "tool",  # ShareGPT's tool result
    "function_call": "assistant",  # ShareGPT's tool call (its value is the call's JSON)
}
# ShareGPT's names of other assistants: read as the assistant, and counted (`Conversation.changes`)
ASSISTANT_VARIANTS = ("chatgpt", "bing", "bard")
LEADING_ASSISTANT_TURN = ("drop", "reject")  # prompts.leading_assistant_turn
ROW_FIELDS = ("messages", "conversations", "prompt")


def _get(mapping: dict, *keys: str) -> Any:
    """The first key present and not None (datasets fills absent columns with None)."""
    for key in keys:
        if mapping.get(key) is not None:
            return mapping[key]
    return None


@dataclass(frozen=True)
class Conversation:
    """A row as the prompts stage keeps it: its messages and the tools its calls may use."""

    messages: list[dict]
    tools: list[dict] | None = None
    # what reading changed, counted in results/prompts/summary.json: e.g. {"leading_assistant_turn_dropped": 1,
    # "role_bing_as_assistant": 2}
    changes: dict[str, int] = field(default_factory=dict)


def normalize_row(value: Any, regenerate_enabled: bool, leading_assistant_turn: str = "drop") -> list[dict]:
    """The row's validated messages (`normalize_conversation`, without the tools)."""
    return normalize_conversation(value, regenerate_enabled, leading_assistant_turn).messages


def normalize_conversation(value: Any, regenerate_enabled: bool, leading_assistant_turn: str = "drop") -> Conversation:
    """The row's validated messages, roles system/user/assistant/tool (an assistant's `tool_calls`
    and `reasoning_content`, a tool result's `tool_call_id` and `name` kept), and its `tools`.

    `leading_assistant_turn` (prompts.leading_assistant_turn): `drop` removes the assistant turns
    before the first user turn (a piece cut from a longer chat, as ShareGPT's cleaned split has
    them) and counts them; `reject` leaves them for the turn-order check, which rejects the row."""
    if not isinstance(value, dict):
        raise BadRow(
            "not_an_object",
            f"the row is a JSON {type(value).__name__}, not an object",
            "write each row as an object with `messages`, `conversations` or `prompt`",
        )
    kind = next((key for key in ROW_FIELDS if value.get(key) is not None), None)
    if kind is None:
        keys = ", ".join(sorted(value)) or "none"
        raise BadRow(
            "unknown_format",
            f"none of the fields {', '.join(ROW_FIELDS)} (the row has: {keys})",
            "give the row `messages` [{role, content}], `conversations` [{from, value}] or a `prompt` string",
        )
    if kind == "prompt" and not isinstance(value["prompt"], list):
        # A plain prompt; a list under `prompt` is read as messages (as speculators does).
        labelled = _prompt_turns(value)
    else:
        turns = value[kind]
        if not isinstance(turns, list):
            raise BadRow(
                "not_a_list",
                f"`{kind}` is a {type(turns).__name__}, not a list of turns",
                f"make `{kind}` a list of {{role, content}} objects",
            )
        labelled = [(f"{kind}[{i}]", turn) for i, turn in enumerate(turns)]
    tools = normalize_tools(value.get("tools"))
    names = {t["function"]["name"] for t in tools} if tools else None
    changes: Counter = Counter()
    messages = [_normalize_turn(at, turn, names, changes) for at, turn in labelled]
    if leading_assistant_turn == "drop":
        messages = _drop_leading_assistant_turns(messages, changes)
    validate_order(kind, messages, regenerate_enabled)
    return Conversation(messages, tools, dict(changes))


def _drop_leading_assistant_turns(messages: list[dict], changes: Counter) -> list[dict]:
    """The messages without the assistant turns before the first user turn (a system turn stays)."""
    start = 1 if messages and messages[0]["role"] == "system" else 0
    end = start
    while end < len(messages) and messages[end]["role"] == "assistant":
        end += 1
    if end == start:
        return messages
    changes["leading_assistant_turn_dropped"] += end - start
    return messages[:start] + messages[end:]


def _prompt_turns(value: dict) -> list[tuple[str, dict]]:
    """(field name, turn) pairs of a plain-prompt row, so errors name the field."""
    turns = []
    if value.get("system") is not None:
        turns.append(("`system`", {"role": "system", "content": value["system"]}))
    turns.append(("`prompt`", {"role": "user", "content": value["prompt"]}))
    for key in ("response", "completion"):
        if value.get(key) is not None:
            turns.append((f"`{key}`", {"role": "assistant", "content": value[key]}))
            break
    return turns


def _normalize_turn(at: str, turn: Any, tool_names: set[str] | None, changes: Counter) -> dict:
    if not isinstance(turn, dict):
        raise BadRow(
            "bad_turn",
            f"{at} is a {type(turn).__name__}, not an object",
            "write each turn as {role, content} or {from, value}",
        )
    role = _get(turn, "role", "from")
    content = _get(turn, "content", "value")
    if role is None:
        raise BadRow("missing_role", f"{at} has no `role` (or `from`)", "give every turn a role")
    if isinstance(role, str) and role.lower() in ASSISTANT_VARIANTS:
        changes[f"role_{role.lower()}_as_assistant"] += 1
        role = "assistant"
    if not isinstance(role, str) or role.lower() not in ROLES:
        raise BadRow(
            "unknown_role",
            f"{at} has unknown role {role!r}",
            "use system, user, assistant or tool (ShareGPT: system, human, gpt, function_call or observation)",
        )
    if role.lower() == "function_call":  # ShareGPT's tool call: the value is the call's JSON
        return {"role": "assistant", "content": "", "tool_calls": tool_calls(at, [json_field(at, content, "value")], tool_names)}
    role = ROLES[role.lower()]
    calls = _get(turn, "tool_calls") if role == "assistant" else None
    calls = None if calls in ([], "", "[]") else calls  # OpenAI exports write [] for no calls
    message = {"role": role, "content": _content(at, content, may_be_empty=calls is not None)}
    if calls is not None:
        message["tool_calls"] = tool_calls(f"{at}.tool_calls", calls, tool_names)
    if role == "assistant":
        reasoning = _get(turn, "reasoning_content", "reasoning", "thinking")  # speculators and vLLM read these
        if reasoning is not None and not isinstance(reasoning, str):
            raise BadRow("bad_content", f"{at} reasoning_content is a {type(reasoning).__name__}, not a string",
                         "give the answer's thinking as plain text")
        if reasoning and reasoning.strip():
            message["reasoning_content"] = reasoning
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if _get(turn, key) is not None:
                if not isinstance(turn[key], str):
                    raise BadRow("bad_tool_result", f"{at}.{key} is a {type(turn[key]).__name__}, not a string",
                                 f"give the tool result's {key} as a string, or leave it out")
                message[key] = turn[key]
    return message


def _content(at: str, content: Any, may_be_empty: bool) -> str:
    if content is None and may_be_empty:
        return ""
    if content is None:
        raise BadRow("missing_content", f"{at} has no `content` (or `value`)", "give every turn its text")
    if not isinstance(content, str):
        raise BadRow(
            "bad_content",
            f"{at} content is a {type(content).__name__}, not a string",
            "content must be plain text (multimodal parts are not supported)",
        )
    if not content.strip() and not may_be_empty:
        raise BadRow("empty_content", f"{at} has empty content", "fill in the turn's text or remove the turn")
    return content



# The message fields beyond role and content that enter a conversation's id.
_ID_FIELDS = ("reasoning_content", "tool_calls", "tool_call_id", "name")


def conversation_id(messages: list[dict], tools: list[dict] | None = None) -> str:
    """A short, stable hash of the normalized messages and tools (independent of source and
    format; a row of plain text turns hashes as it always has)."""
    turns = []
    for m in messages:
        extra = {k: m[k] for k in _ID_FIELDS if m.get(k) is not None}
        turns.append([m["role"], m["content"], extra] if extra else [m["role"], m["content"]])
    payload = {"messages": turns, "tools": tools} if tools else turns
    canonical = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
