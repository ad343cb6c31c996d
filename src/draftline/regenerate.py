"""Regenerate every assistant turn with the target itself (vLLM), turn by turn.

The draft learns to predict the *target's* tokens, so the training answers must be the
target's own: for turn t each conversation is sent as system + user turns + the target's own
answers to turns < t (never the dataset's), and the answer replaces the dataset's assistant
turn t. A trailing user turn gets an answer too. Turns are batched across conversations (all
first turns in one `LLM.chat` call, then all second turns, ...), which is what keeps vLLM busy.
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from draftline.artifacts import conversations as conversation_file
from draftline.engine import EngineSettings, target_llm
from draftline.config_schema import default

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
# Left free after each answer for the end-of-turn tokens the template appends, so the rendered
# conversation still fits tokenize.max_seq_len and tokenization cuts nothing the target wrote.
END_OF_TURN_ROOM = 8


@dataclass(frozen=True)
class RegenerateSettings(EngineSettings):
    """The `regenerate:` config block; `max_model_len` is tokenize.max_seq_len, so nothing
    generated is cut later."""

    max_new_tokens: int = default("regenerate", "max_new_tokens")
    temperature: float = default("regenerate", "temperature")
    top_p: float = default("regenerate", "top_p")
    chat_template: str | None = None  # path to a Jinja template replacing the tokenizer's


@dataclass
class _Conversation:
    id: str
    row: dict
    system: list[dict]
    users: list[str]
    answers: list[dict] = field(default_factory=list)
    stopped_at: int | None = None  # turn index whose prompt no longer fit the context

    def context(self, turn: int) -> list[dict]:
        messages = list(self.system)
        for i in range(turn):
            messages += [{"role": "user", "content": self.users[i]}, {"role": "assistant", "content": self.answers[i]["content"]}]
        messages.append({"role": "user", "content": self.users[turn]})
        return messages

    def messages(self) -> list[dict]:
        messages = list(self.system)
        for user, answer in zip(self.users, self.answers, strict=False):
            messages += [{"role": "user", "content": user}, answer]
        return messages


def parse_conversation(row: Any, where: str) -> _Conversation:
    """Split a prompts-stage row into system / user turns; the dataset's answers are dropped."""
    if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(row.get("messages"), list):
        raise ValueError(f"{where}: expected an object with a string 'id' and a list 'messages' (the prompts stage's format)")
    rid, messages = row["id"], row["messages"]
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"{where} (id {rid!r}): messages[{k}] must be {{'role': system|user|assistant, 'content': str}}")
    system = [{"role": "system", "content": messages[0]["content"]}] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(system) :]
    for k, m in enumerate(rest):
        expected = "user" if k % 2 == 0 else "assistant"
        if m["role"] != expected:
            raise ValueError(
                f"{where} (id {rid!r}): messages[{k + len(system)}] has role {m['role']!r}, expected {expected!r} "
                "(system first if present, then alternating user/assistant)"
            )
    users = [m["content"] for m in rest[0::2]]
    if not users:
        raise ValueError(f"{where} (id {rid!r}): no user turn to answer")
    return _Conversation(id=rid, row=row, system=system, users=users)


def read_conversations(path: str | Path) -> list[_Conversation]:
    return [parse_conversation(row, f"{path} (row {i + 1})") for i, row in enumerate(conversation_file.read(path))]


class _LogProgress(tqdm):
    """vLLM's progress bar, written to the log every 30 s instead of redrawn on a terminal."""

    def __init__(self, *args, **kwargs):
        kwargs.update(mininterval=30, file=io.StringIO(), ascii=True)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if self.n and self.n != getattr(self, "_logged_n", None):  # not the empty bar, not twice
            self._logged_n = self.n
            log.info("  %s", self.format_meter(**self.format_dict).strip())
        return True


def _prompt_len(tokenizer, messages: list[dict], chat_template: str | None) -> int:
    # Rendered to text then tokenized without special tokens, as vLLM's chat() does.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=chat_template)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def regenerate_conversations(llm, conversations: list[_Conversation], settings: RegenerateSettings, chat_template: str | None = None) -> tuple[list[dict], dict]:
    """Answer every user turn of every conversation with `llm`; return (rows, statistics).

    A turn whose prompt leaves no room to answer within max_model_len ends its conversation
    there (turns before it are kept); a conversation whose first prompt does not fit is left out.
    Both are counted. An answer cut at the token limit is kept and marked `"truncated": true`.
    """
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    stats = {
        "rows_in": len(conversations),
        "turns_generated": 0,
        "answers_truncated": 0,
        "answers_capped_by_context": 0,
        "rows_skipped_prompt_too_long": 0,
        "rows_shortened_prompt_too_long": 0,
        "generated_tokens": 0,
        "prompt_tokens": 0,
    }
    started = time.monotonic()
    max_turns = max(len(c.users) for c in conversations) if conversations else 0
    for turn in range(max_turns):
        batch, prompts, params = [], [], []
        for index, conv in enumerate(conversations):
            if conv.stopped_at is not None or turn >= len(conv.users):
                continue
            messages = conv.context(turn)
            room = settings.max_model_len - _prompt_len(tokenizer, messages, chat_template) - END_OF_TURN_ROOM
            if room < 1:
                conv.stopped_at = turn
                continue
            batch.append(conv)
            prompts.append(messages)
            params.append(
                SamplingParams(
                    max_tokens=min(settings.max_new_tokens, room),
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    # per request, so an answer does not depend on what else is in the batch
                    seed=settings.seed + 1000 * index + turn,
                )
            )
        if not batch:
            break
        log.info("turn %d: answering %d conversations", turn + 1, len(batch))
        outputs = llm.chat(prompts, params, use_tqdm=_LogProgress, chat_template=chat_template)
        for conv, param, output in zip(batch, params, outputs, strict=True):
            completion = output.outputs[0]
            answer = {"role": "assistant", "content": completion.text}
            if completion.finish_reason == "length":
                answer["truncated"] = True
                stats["answers_truncated"] += 1
                stats["answers_capped_by_context"] += param.max_tokens < settings.max_new_tokens
            conv.answers.append(answer)
            stats["generated_tokens"] += len(completion.token_ids)
            stats["prompt_tokens"] += len(output.prompt_token_ids or [])
        stats["turns_generated"] += len(batch)
        elapsed = time.monotonic() - started
        log.info(
            "turn %d done: %d answers so far, %d generated tokens, %.1f tok/s",
            turn + 1, stats["turns_generated"], stats["generated_tokens"], stats["generated_tokens"] / max(elapsed, 1e-9),
        )

    rows = []
    for conv in conversations:
        if conv.stopped_at == 0:
            stats["rows_skipped_prompt_too_long"] += 1
            log.warning("id %r left out: its first prompt does not fit max_model_len=%d", conv.id, settings.max_model_len)
            continue
        if conv.stopped_at is not None:
            stats["rows_shortened_prompt_too_long"] += 1
        rows.append({**conv.row, "messages": conv.messages()})
    stats["rows_out"] = len(rows)
    stats["seconds"] = round(time.monotonic() - started, 1)
    stats["tokens_per_second"] = round(stats["generated_tokens"] / max(stats["seconds"], 1e-9), 1)
    return rows, stats


def regenerate(
    target_dir: str | Path,
    conversations_path: str | Path,
    out_conversations: str | Path,
    out_summary: str | Path,
    settings: RegenerateSettings,
    llm=None,
) -> dict:
    """Read prompts-stage rows, regenerate their answers, publish rows and summary atomically."""
    from draftline.atomic import atomic_file

    conversations = read_conversations(conversations_path)
    if not conversations:
        raise ValueError(f"{conversations_path}: no conversations to regenerate")
    chat_template = Path(settings.chat_template).read_text(encoding="utf-8") if settings.chat_template else None
    log.info("%d conversations from %s; target %s; %s", len(conversations), conversations_path, target_dir, settings)
    load_started = time.monotonic()
    llm = llm or target_llm(target_dir, settings)
    log.info("target loaded in %.1f s", time.monotonic() - load_started)
    rows, stats = regenerate_conversations(llm, conversations, settings, chat_template)
    if not rows:
        raise ValueError(
            f"no conversation fits max_model_len={settings.max_model_len} (tokenize.max_seq_len); raise it"
        )
    conversation_file.write(out_conversations, rows)
    summary = {**stats, "settings": {k: v for k, v in vars(settings).items() if k != "threads"}}
    with atomic_file(out_summary, encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    log.info(
        "%d rows written (%d left out, %d shortened: prompt too long), %d answers truncated at %d tokens, %.1f tok/s",
        stats["rows_out"], stats["rows_skipped_prompt_too_long"], stats["rows_shortened_prompt_too_long"],
        stats["answers_truncated"], settings.max_new_tokens, stats["tokens_per_second"],
    )
    return summary
