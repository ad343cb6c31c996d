"""The order of a conversation's turns: system first, then user and assistant in turn, each
assistant turn with tool calls followed by one tool result per call."""

from __future__ import annotations

from draftline.sources.errors import BadRow

TURN_ORDER = (
    "after an optional system message, turns go user, assistant, user, ...; an assistant turn with "
    "tool_calls is followed by one tool message per call, then the assistant again"
)


def validate_order(kind: str, messages: list[dict], regenerate_enabled: bool) -> None:
    if not messages:
        raise BadRow("empty_conversation", f"`{kind}` is empty", "add at least one user turn or remove the row")
    roles = [m["role"] for m in messages]
    for i, role in enumerate(roles[1:], start=1):
        if role == "system":
            raise BadRow(
                "system_not_first",
                f"{kind}[{i}] is a system message after the first turn",
                "put the one system message first, or merge it into the user turn",
            )
    if "user" not in roles:
        raise BadRow("no_user_turn", "the conversation has no user turn", "add the user's prompt")
    expected, owed, caller = "user", 0, 0  # owed: tool results the last calls still wait for
    for i in range(1 if roles[0] == "system" else 0, len(roles)):
        role = roles[i]
        if role == "tool" and not owed:
            raise BadRow("tool_without_call", f"{kind}[{i}] is a tool result that answers no call ({TURN_ORDER})",
                         "give the assistant turn before it its tool_calls, or remove the tool message")
        if role != "tool" and owed:
            raise BadRow("tool_results_missing", f"{kind}[{i}] is {role} while {owed} of the calls of {kind}[{caller}] "
                         "have no tool result yet", "give every tool call its tool message, in the calls' order")
        if role != expected and role != "tool":
            raise BadRow(
                "not_alternating",
                f"{kind}[{i}] is {role} where {expected} was expected ({TURN_ORDER})",
                "merge consecutive turns of one role, or remove the extra turn",
            )
        if role == "tool":
            owed -= 1
            expected = "assistant"
        elif role == "assistant" and messages[i].get("tool_calls"):
            owed, caller, expected = len(messages[i]["tool_calls"]), i, "tool"
        else:
            expected = "assistant" if role == "user" else "user"
    if owed and roles[-1] == "tool":
        raise BadRow("tool_results_missing", f"{owed} of the calls of {kind}[{caller}] have no tool result",
                     "give every tool call its tool message, in the calls' order")
    if not regenerate_enabled and roles[-1] != "assistant":
        raise BadRow(
            "no_final_assistant",
            f"the conversation ends with a {roles[-1]} turn and regenerate.enabled is false, so there "
            "is no answer to train on",
            "add the assistant's answer, or set regenerate.enabled: true to have the target answer",
        )

