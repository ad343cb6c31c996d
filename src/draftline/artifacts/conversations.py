"""Conversation rows between stages: `results/prompts/{prompts,validation,test,rejects}.jsonl`
and `results/regenerated/conversations.jsonl` (and regeneration's own shard and staged-chunk
rows, `results/regenerated/shard_<k>/conversations.jsonl`, `.staging/<key>/chunk_*.jsonl`).

One JSON object per line: `{"id": str, "source": str, "messages": [{"role":
"system"|"user"|"assistant"|"tool", "content": str}, ...], "tools": [...]}` (`tools`, OpenAI
function schemas, only when the row has them); an assistant message may carry `tool_calls`
([{id?, type: "function", function: {name, arguments: {...}}}]) and `reasoning_content`, a tool
message `tool_call_id` and `name`; a regenerated assistant message cut at max_new_tokens
carries `"truncated": true`. Written by prompts and regeneration, read by
regeneration, tokenization and evaluation, all through `write` and `read` (or `iter_rows`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from draftline.runtime.atomic import atomic_file

# What a chat template sees of a message besides role and content (vLLM's chat API passes the
# same: tool calls with their arguments as objects, a tool result's call id and name, and the
# thinking as both `reasoning_content` and `reasoning`).
TEMPLATE_FIELDS = ("tool_calls", "tool_call_id", "name", "reasoning_content")


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as a chat template (vLLM's `LLM.chat`, `apply_chat_template`) gets them:
    draftline's own marks (`truncated`) left out."""
    out = []
    for m in messages:
        message = {"role": m["role"], "content": m["content"]}
        message.update({k: m[k] for k in TEMPLATE_FIELDS if m.get(k) is not None})
        if "reasoning_content" in message:
            message["reasoning"] = message["reasoning_content"]
        out.append(message)
    return out


def encode(row: dict) -> str:
    """One row as its line in the file, without the newline."""
    return json.dumps(row, ensure_ascii=False)


def write(path: str | Path, rows: Iterable[dict]) -> None:
    """All rows, published in one rename (a killed job leaves no half file)."""
    write_encoded(path, map(encode, rows))


def write_encoded(path: str | Path, lines: Iterable[str]) -> None:
    """Rows already `encode`d (kept encoded on the way, e.g. in a spool file), published as `write` does."""
    with atomic_file(path, encoding="utf-8") as out:
        for line in lines:
            out.write(line)
            out.write("\n")


def iter_rows(path: str | Path) -> Iterator[dict]:
    """The rows one at a time (a file of 10^5 conversations is never held whole), each checked
    for a string `id` and a list `messages`; errors name file:line. Blank lines are skipped."""
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err})") from err
            if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(row.get("messages"), list):
                raise ValueError(
                    f"{path}:{lineno}: expected an object with a string 'id' and a list 'messages' "
                    "(the prompts stage's format)"
                )
            yield row


def count_rows(path: str | Path) -> int:
    """How many rows `iter_rows` yields (non-blank lines), without parsing them."""
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def read(path: str | Path) -> list[dict]:
    """Every row (see `iter_rows`)."""
    return list(iter_rows(path))
