"""A prompts-stage row being answered: its system and user turns, the data's tool results of each
turn, and the transcript the target is asked next (parse_conversation, Conversation)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftline.artifacts import conversations as conversation_file

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class _Result:
    """A tool result of the data: its message, and the call it answered there (id, function)."""

    message: dict
    call_id: str | None
    function: str | None


@dataclass
class Conversation:
    """One row being answered: its system and user turns, the data's tool results of each user
    turn (spliced back after the target's own calls), and the transcript so far."""

    id: str
    row: dict
    system: list[dict]
    users: list[str]
    results: list[list[_Result]] = field(default_factory=list)  # per user turn
    transcript: list[dict] = field(default_factory=list)  # what the target is asked next
    turn: int = 0  # the user turn being answered
    spliced: int = 0  # results of this turn given back so far
    generations: int = 0  # answers and calls so far (the request seed's counter)
    stopped_at: int | None = None  # user turn whose prompt no longer fit the context
    done: bool = False

    def __post_init__(self):
        self.results = self.results or [[] for _ in self.users]
        self.transcript = [*self.system, {"role": "user", "content": self.users[0]}]

    @property
    def tools(self) -> list[dict] | None:
        return self.row.get("tools")

    def answered(self, answer: dict) -> None:
        """A final answer: the turn is done, the next user turn (if any) is asked."""
        self.transcript.append(answer)
        self.turn, self.spliced = self.turn + 1, 0
        if self.turn == len(self.users):
            self.done = True
        else:
            self.transcript.append({"role": "user", "content": self.users[self.turn]})

    def splice(self, calls: list[dict]) -> bool:
        """The data's next results of this turn after the target's `calls`, one per call, when
        there are enough and each answers the function called (speculators' guard); else the
        conversation ends at the calls (False)."""
        results = self.results[self.turn][self.spliced : self.spliced + len(calls)]
        if len(results) < len(calls) or any(
            r.function and r.function != c["function"]["name"] for r, c in zip(results, calls, strict=True)
        ):
            self.done = True
            return False
        for result, call in zip(results, calls, strict=True):
            self.transcript.append({**result.message, **({"tool_call_id": call["id"]} if "id" in call else {})})
        self.spliced += len(calls)
        return True

    def call_id(self, j: int) -> str:
        """The id of the target's j-th call of this turn: the data's call's there, else a stable one."""
        at = self.spliced + j
        results = self.results[self.turn]
        return (results[at].call_id if at < len(results) else None) or f"call_{self.turn}_{at}"

    def messages(self) -> list[dict]:
        """What was answered: the transcript without a trailing prompt left unanswered."""
        out = list(self.transcript)
        while out and out[-1]["role"] != "assistant":
            out.pop()
        return out


def parse_conversation(row: Any, where: str) -> Conversation:
    """Split a prompts-stage row into system / user turns and each turn's tool results; the
    dataset's answers (and its tool calls) are dropped."""
    if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(row.get("messages"), list):
        raise ValueError(f"{where}: expected an object with a string 'id' and a list 'messages' (the prompts stage's format)")
    rid, messages = row["id"], row["messages"]
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"{where} (id {rid!r}): messages[{k}] must be {{'role': system|user|assistant|tool, 'content': str}}")
    system = [{"role": "system", "content": messages[0]["content"]}] if messages and messages[0]["role"] == "system" else []
    users, results, calls, expected = [], [], [], ("user",)
    for k, m in enumerate(messages[len(system) :], start=len(system)):
        if m["role"] not in expected:
            raise ValueError(
                f"{where} (id {rid!r}): messages[{k}] has role {m['role']!r}, expected {' or '.join(map(repr, expected))} "
                "(system first if present, then alternating user/assistant; tool results after an assistant's tool calls)"
            )
        if m["role"] == "user":
            users.append(m["content"])
            results.append([])
            expected = ("assistant",)
        elif m["role"] == "assistant":
            calls = list(m.get("tool_calls") or [])
            expected = ("tool",) if calls else ("user",)
        else:
            call = calls.pop(0)
            message = {key: m[key] for key in ("role", "content", "tool_call_id", "name") if key in m}
            results[-1].append(_Result(message, call.get("id"), m.get("name") or call["function"]["name"]))
            expected = ("tool",) if calls else ("assistant",)
    if not users:
        raise ValueError(f"{where} (id {rid!r}): no user turn to answer")
    return Conversation(id=rid, row=row, system=system, users=users, results=results)


def read_conversations(path: str | Path) -> list[Conversation]:
    return [parse_conversation(row, f"{path} (row {i + 1})") for i, row in enumerate(conversation_file.iter_rows(path))]
