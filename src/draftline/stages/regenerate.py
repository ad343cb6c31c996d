"""Regenerate every assistant turn with the target itself (vLLM), turn by turn.

The draft learns to predict the *target's* tokens, so the training answers must be the
target's own: for turn t each conversation is sent as system + user turns + the target's own
answers to turns < t (never the dataset's), and the answer replaces the dataset's assistant
turn t. A trailing user turn gets an answer too. Turns are batched across the conversations of
a chunk (all first turns in one `LLM.chat` call, then all second turns, ...), which is what
keeps vLLM busy.

Sharded and resumable, in three rules:
- `write_answer_settings` (rule regenerate_settings, cheap): what decides the answers (target
  identity, generation settings, code, versions, the prompts file by content) and its hash, the
  *answer key*, in `results/regenerated/settings.json`. Tokenization follows this file rather
  than the merged file's mtime, so a new shard count (the same answers) reruns nothing after
  the merge.
- `regenerate_shard` (rule regenerate_shard, one GPU job per shard): the conversations
  `shard_rows(rows, k, shards)` of the prompts file, answered `chunk_conversations` at a time
  through all their turns. Each finished chunk is kept, checked, in
  `results/regenerated/.staging/<answer key>/` (no output, so Snakemake never deletes it): a
  killed job's rerun answers only the conversations no chunk holds, and so does a job of a new
  shard count. Staging of other keys is removed.
- `merge_shards` (checkpoint regenerate_merge, CPU): the shards' rows, streamed in the prompts
  file's order, into `results/regenerated/conversations.jsonl`, their statistics summed, and
  the merged file's sha256 in `conversations.sha256`. Tokenization follows that file (and the
  answer key), so it reruns when the merge wrote other answers and not when it wrote the same.

An answer is meant not to depend on the shard or chunk its conversation lands in: each request's
seed is a function of the conversation's index in the prompts file and the turn, and greedy
decoding on CPU gives the same tokens in any batch. On GPUs vLLM's answers can change with the
batch's composition, so conversations answered again in other batches (a new shard count or
chunk size without their staged chunks) can get other answers: the sha256 then differs and
tokenization reruns.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import islice
from pathlib import Path
from typing import Any

from tqdm import tqdm

from draftline.artifacts import conversations as conversation_file
from draftline.artifacts.hidden_states import shard_rows
from draftline.lineage.content_hash import sha256_file
from draftline.planning.config_schema import default
from draftline.runtime.atomic import atomic_dir, atomic_file
from draftline.runtime.shards import ShardJob
from draftline.runtime.vllm_engine import EngineSettings, shutdown, target_llm

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
# Left free after each answer for the end-of-turn tokens the template appends, so the rendered
# conversation still fits tokenize.max_seq_len and tokenization cuts nothing the target wrote.
END_OF_TURN_ROOM = 8
# Per-conversation counters; a shard's and the merged summary's are their sums.
COUNTERS = (
    "rows_in", "rows_out", "turns_generated", "answers_truncated", "answers_capped_by_context",
    "rows_skipped_prompt_too_long", "rows_shortened_prompt_too_long", "generated_tokens", "prompt_tokens",
    "tool_calls_generated", "tool_results_spliced", "rows_shortened_tool_results",
)
SHARD_CONVERSATIONS = "conversations.jsonl"  # in each shard folder, beside
SHARD_SUMMARY = "summary.json"


@dataclass(frozen=True)
class RegenerateSettings(EngineSettings):
    """The `regenerate:` config block on the run's engine settings; `max_model_len` is
    tokenize.max_seq_len unless vllm.max_model_len, so nothing generated is cut later."""

    max_new_tokens: int = default("regenerate", "max_new_tokens")
    temperature: float = default("regenerate", "temperature")
    top_p: float = default("regenerate", "top_p")
    chat_template: str | None = None  # path to a Jinja template replacing the tokenizer's
    # target.chat_template_kwargs: the template's variables (e.g. enable_thinking)
    chat_template_kwargs: dict = field(default_factory=dict)
    # vLLM's tool parser (its --tool-call-parser) reading the target's calls in rows with tools
    tool_call_parser: str = default("regenerate", "tool_call_parser")
    chunk_conversations: int = default("regenerate", "chunk_conversations")  # not an answer setting


@dataclass(frozen=True)
class _Result:
    """A tool result of the data: its message, and the call it answered there (id, function)."""

    message: dict
    call_id: str | None
    function: str | None


@dataclass
class _Conversation:
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


def parse_conversation(row: Any, where: str) -> _Conversation:
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
    return _Conversation(id=rid, row=row, system=system, users=users, results=results)


class ToolCalls:
    """The target's tool calls read from its answer with vLLM's own tool parser
    (`regenerate.tool_call_parser`, vLLM's `--tool-call-parser`), as its chat API reads them;
    built when a row with tools is first answered."""

    def __init__(self, parser: str, tokenizer):
        self.name, self.tokenizer, self._parser, self._requests = parser, tokenizer, None, {}

    def parser(self):
        if self._parser is None:
            from vllm.tool_parsers import ToolParserManager

            try:
                self._parser = ToolParserManager.get_tool_parser(self.name)(self.tokenizer)
            except KeyError:
                raise ValueError(
                    f"regenerate.tool_call_parser is {self.name!r}, not one of vLLM's tool parsers "
                    f"({', '.join(ToolParserManager.list_registered())}); set the one the target is served with"
                ) from None
        return self._parser

    def request(self, tools: list[dict]):
        """The chat request vLLM's server would build for these tools, as the parser adjusts it."""
        key = json.dumps(tools, sort_keys=True)
        if key not in self._requests:
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

            self._requests[key] = self.parser().adjust_request(ChatCompletionRequest(messages=[], tools=tools))
        return self._requests[key]

    def sampling(self, tools: list[dict] | None) -> dict:
        """SamplingParams the parser needs (e.g. special tokens kept: some targets' call tags are special)."""
        return {"skip_special_tokens": self.request(tools).skip_special_tokens} if tools else {}

    def parse(self, text: str, tools: list[dict]) -> tuple[str, list[dict]] | None:
        """(content, calls) of an answer that calls tools, None for a plain answer."""
        info = self.parser().extract_tool_calls(text, self.request(tools))
        if not info.tools_called or not info.tool_calls:
            return None
        calls = []
        for call in info.tool_calls:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError:
                return None  # not a call a template can render back: kept as the text it is
            if not isinstance(arguments, dict):
                return None
            calls.append({"type": "function", "function": {"name": call.function.name, "arguments": arguments}})
        return info.content or "", calls


def read_conversations(path: str | Path) -> list[_Conversation]:
    return [parse_conversation(row, f"{path} (row {i + 1})") for i, row in enumerate(conversation_file.iter_rows(path))]


class _LogProgress(tqdm):
    """vLLM's progress bar, written to the log every 30 s instead of redrawn on a terminal."""

    def __init__(self, *args, **kwargs):
        kwargs.update(mininterval=30, file=io.StringIO(), ascii=True)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if str(self.desc).startswith("Rendering"):  # vLLM's chat rendering: a blink, a line a turn
            return True
        if self.n and self.n != getattr(self, "_logged_n", None):  # not the empty bar, not twice
            self._logged_n = self.n
            log.info("  %s", self.format_meter(**self.format_dict).strip())
        return True


def _prompt_len(tokenizer, messages: list[dict], chat_template: str | None, template_kwargs: dict | None = None,
                tools: list[dict] | None = None) -> int:
    # Rendered to text then tokenized without special tokens, as vLLM's chat() does.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=chat_template,
                                         tools=tools, **(template_kwargs or {}))
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class Answered:
    """One conversation's outcome: its regenerated row (None when its first prompt does not fit
    max_model_len) and its counters (COUNTERS)."""

    index: int  # in the prompts file
    id: str
    row: dict | None
    stats: dict[str, int]


def _sum_stats(stats: Iterable[dict[str, int]]) -> dict[str, int]:
    total = dict.fromkeys(COUNTERS, 0)
    for s in stats:
        for k in COUNTERS:
            total[k] += s.get(k, 0)
    return total


def answer_conversations(
    llm, conversations: Sequence[_Conversation], indices: Sequence[int], settings: RegenerateSettings,
    chat_template: str | None = None,
) -> list[Answered]:
    """Answer every user turn of `conversations` (at `indices` of the prompts file) with `llm`,
    in rounds: each round asks every unfinished conversation its next answer in one `LLM.chat`
    call (one per tool set: vLLM renders a call's tools into all its prompts).

    In a row with tools the target's calls are read with vLLM's tool parser and the data's
    results of that turn given back in order, and the target answers again; a call with no result
    left, or for another function than the data's result answers, ends the conversation there.
    A prompt that leaves no room to answer within max_model_len ends its conversation there
    (what came before is kept); a conversation with no answer at all is left out (row None).
    Both are counted. An answer cut at the token limit is kept and marked `"truncated": true`.
    """
    tokenizer = llm.get_tokenizer()
    calls = ToolCalls(settings.tool_call_parser, tokenizer)
    stats = [{**dict.fromkeys(COUNTERS, 0), "rows_in": 1} for _ in conversations]
    for round_ in itertools.count(1):
        requests = _requests(conversations, indices, settings, tokenizer, chat_template, calls)
        if not requests:
            break
        log.info("round %d: answering %d conversations", round_, len(requests))
        by_tools: dict[str, list] = {}
        for request in requests:
            by_tools.setdefault(json.dumps(conversations[request[0]].tools, sort_keys=True), []).append(request)
        for group in by_tools.values():
            tools = conversations[group[0][0]].tools
            outputs = llm.chat([m for _, m, _ in group], [p for _, _, p in group], use_tqdm=_LogProgress,
                               chat_template=chat_template, chat_template_kwargs=settings.chat_template_kwargs or None,
                               **({"tools": tools} if tools else {}))
            for (k, _, param), output in zip(group, outputs, strict=True):
                _take(conversations[k], output, stats[k], param.max_tokens < settings.max_new_tokens, calls)

    answered = []
    for k, conv in enumerate(conversations):
        s, row = stats[k], None
        messages = conv.messages()
        if not messages:
            s["rows_skipped_prompt_too_long"] = 1
            log.warning("id %r left out: its first prompt does not fit max_model_len=%d", conv.id, settings.max_model_len)
        else:
            s["rows_shortened_prompt_too_long"] = int(conv.stopped_at is not None)
            s["rows_out"] = 1
            row = {**conv.row, "messages": messages}
        answered.append(Answered(indices[k], conv.id, row, s))
    return answered


def _requests(conversations, indices, settings: RegenerateSettings, tokenizer, chat_template, calls: ToolCalls) -> list:
    """(conversation, messages, SamplingParams) of every conversation that waits for an answer
    and has room for one; one that has none stops there."""
    from vllm import SamplingParams

    out = []
    for k, conv in enumerate(conversations):
        if conv.done:
            continue
        messages = conversation_file.template_messages(conv.transcript)
        prompt_len = _prompt_len(tokenizer, messages, chat_template, settings.chat_template_kwargs, conv.tools)
        room = settings.max_model_len - prompt_len - END_OF_TURN_ROOM
        if room < 1:
            conv.stopped_at, conv.done = conv.turn, True
            continue
        params = SamplingParams(
            max_tokens=min(settings.max_new_tokens, room),
            temperature=settings.temperature,
            top_p=settings.top_p,
            # per request, from the conversation's place in the prompts file: an answer
            # depends neither on the batch nor on the shard or chunk it lands in
            seed=settings.seed + 1000 * indices[k] + conv.generations,
            **calls.sampling(conv.tools),
        )
        out.append((k, messages, params))
    return out


def _take(conv: _Conversation, output, s: dict, capped: bool, calls: ToolCalls) -> None:
    """One answer into its conversation: a call (results spliced back) or the turn's answer."""
    completion = output.outputs[0]
    truncated = completion.finish_reason == "length"
    conv.generations += 1
    s["turns_generated"] += 1
    s["generated_tokens"] += len(completion.token_ids)
    s["prompt_tokens"] += len(output.prompt_token_ids or [])
    called = calls.parse(completion.text, conv.tools) if conv.tools and not truncated else None
    if called:
        content, made = called
        made = [{"id": conv.call_id(j), **call} for j, call in enumerate(made)]
        conv.transcript.append({"role": "assistant", "content": content, "tool_calls": made})
        s["tool_calls_generated"] += len(made)
        if conv.splice(made):
            s["tool_results_spliced"] += len(made)
        else:
            s["rows_shortened_tool_results"] += 1
        return
    answer = {"role": "assistant", "content": completion.text}
    if truncated:
        answer["truncated"] = True
        s["answers_truncated"] += 1
        s["answers_capped_by_context"] += capped
    conv.answered(answer)


class _Progress:
    """Conversations done / total, tokens/s, time left and truncations so far, logged after
    every chunk (vLLM's own bar adds a line every 30 s within a chunk)."""

    def __init__(self, total: int, reused: Iterable[dict[str, int]] = ()):
        reused = list(reused)
        self.total, self.done, self.answered_now = total, len(reused), 0
        self.truncated = sum(s["answers_truncated"] for s in reused)
        self.answers = sum(s["turns_generated"] for s in reused)
        self.tokens_now = 0
        self.started = time.monotonic()

    def add(self, answered: Sequence[Answered]) -> None:
        self.done += len(answered)
        self.answered_now += len(answered)
        self.truncated += sum(a.stats["answers_truncated"] for a in answered)
        self.answers += sum(a.stats["turns_generated"] for a in answered)
        self.tokens_now += sum(a.stats["generated_tokens"] for a in answered)
        elapsed = max(time.monotonic() - self.started, 1e-9)
        left = timedelta(seconds=round(elapsed / self.answered_now * (self.total - self.done)))
        log.info(
            "progress: %d/%d conversations (%.1f%%), %.1f tok/s, about %s left, %d of %d answers truncated so far",
            self.done, self.total, 100 * self.done / max(self.total, 1), self.tokens_now / elapsed, left,
            self.truncated, self.answers,
        )

    @property
    def tokens_per_second(self) -> float:
        return round(self.tokens_now / max(time.monotonic() - self.started, 1e-9), 1)


def _runs(indices: Sequence[int], size: int) -> Iterator[list[int]]:
    """Consecutive indices, at most `size` at a time: a staged chunk is always one contiguous
    range, so staged chunks sort into the prompts file's order."""
    chunk: list[int] = []
    for i in indices:
        if chunk and (len(chunk) == size or i != chunk[-1] + 1):
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk


def _chat_template(settings: RegenerateSettings) -> str | None:
    return Path(settings.chat_template).read_text(encoding="utf-8") if settings.chat_template else None


def regenerate(
    target_dir: str | Path,
    conversations_path: str | Path,
    out_conversations: str | Path,
    out_summary: str | Path,
    settings: RegenerateSettings,
    llm=None,
) -> dict:
    """Every conversation in one process, nothing staged (the shards' rules do the same work
    split up and resumable): read prompts-stage rows, regenerate their answers, publish rows and
    summary atomically."""
    conversations = read_conversations(conversations_path)
    if not conversations:
        raise ValueError(f"{conversations_path}: no conversations to regenerate")
    chat_template = _chat_template(settings)
    log.info("%d conversations from %s; target %s; %s", len(conversations), conversations_path, target_dir, settings)
    load_started = time.monotonic()
    llm = llm or target_llm(target_dir, settings)
    log.info("target loaded in %.1f s", time.monotonic() - load_started)
    progress, answered = _Progress(len(conversations)), []
    for chunk in _runs(range(len(conversations)), settings.chunk_conversations):
        done = answer_conversations(llm, [conversations[i] for i in chunk], chunk, settings, chat_template)
        progress.add(done)
        answered += done
    rows = [a.row for a in answered if a.row is not None]
    if not rows:
        raise ValueError(f"no conversation fits max_model_len={settings.max_model_len} (vllm.max_model_len, by default "
                         "tokenize.max_seq_len); raise it")
    conversation_file.write(out_conversations, rows)
    stats = _sum_stats(a.stats for a in answered)
    stats["seconds"] = round(time.monotonic() - progress.started, 1)
    stats["tokens_per_second"] = progress.tokens_per_second
    summary = {**stats, "settings": {k: v for k, v in vars(settings).items() if k != "threads"}}
    _write_json(out_summary, summary)
    _log_summary(stats, settings.max_new_tokens)
    return summary


def _log_summary(stats: dict, max_new_tokens: int | None) -> None:
    log.info(
        "%d rows written (%d left out, %d shortened: prompt too long), %d answers truncated at %s tokens",
        stats["rows_out"], stats["rows_skipped_prompt_too_long"], stats["rows_shortened_prompt_too_long"],
        stats["answers_truncated"], max_new_tokens,
    )


def _write_json(path: str | Path, value: Any) -> None:
    with atomic_file(path, encoding="utf-8") as handle:
        json.dump(value, handle, indent=2)
        handle.write("\n")


# ---------------------------------------------------------------- answer settings (the key)


def write_answer_settings(
    conversations_path: str | Path, out: str | Path, answers: dict, also: dict | None = None
) -> dict:
    """`results/regenerated/settings.json`: `answers` (everything else that decides the answers:
    target identity, generation settings, code, versions), the prompts file by content, and
    `key`, the hash of both. `also` (the merge's code) is recorded without entering the key:
    a change there reruns what follows but keeps the staged answers."""
    rows = conversation_file.count_rows(conversations_path)
    if not rows:
        raise ValueError(f"{conversations_path}: no conversations to regenerate")
    prompts = {"rows": rows, "sha256": sha256_file(conversations_path)}
    answers = json.loads(json.dumps(answers, sort_keys=True, default=str))
    key = hashlib.sha256(json.dumps({"answers": answers, "prompts": prompts}, sort_keys=True).encode()).hexdigest()[:16]
    record = {"key": key, "answers": answers, "prompts": prompts, "also": dict(sorted((also or {}).items()))}
    _write_json(out, record)
    log.info("answer key %s: %d conversations in %s (sha256 %s)", key, rows, conversations_path, prompts["sha256"][:12])
    return record


def read_answer_settings(path: str | Path) -> dict:
    try:
        record = json.loads(Path(path).read_text())
        record["key"], record["prompts"]["rows"]  # noqa: B018 - the fields every reader uses
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a regeneration settings file ({err}); rerun rule regenerate_settings") from err
    return record


# ---------------------------------------------------------------- staging


class StagedChunkError(ValueError):
    """A staged chunk that is unreadable, of other settings, or does not match the prompts."""


_CHUNK = re.compile(r"chunk_(\d+)-(\d+)\.json")


@dataclass
class _Chunk:
    """A staged chunk: conversations start..stop-1 (contiguous) of the prompts file."""

    start: int
    stop: int
    rows_path: Path
    meta_path: Path
    ids: list[str]
    stats: list[dict[str, int]]


class Staging:
    """`<root>/<key>/chunk_<start>-<stop>.jsonl` (the kept rows, conversation-row format) and
    `.json` (ids and counters of every conversation of the chunk, the rows file's sha256).
    The .json is written last: a chunk without it was never finished."""

    def __init__(self, root: str | Path, key: str):
        self.root, self.key = Path(root), key
        self.folder = self.root / key

    def prepare(self) -> None:
        # Chunks answered with other settings are never reusable.
        if self.root.is_dir():
            for stale in self.root.iterdir():
                if stale.name != self.key and stale.is_dir():
                    log.info("removing staged answers of other settings: %s", stale)
                    shutil.rmtree(stale, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)

    def stage(self, answered: Sequence[Answered]) -> None:
        start, stop = answered[0].index, answered[-1].index + 1
        assert [a.index for a in answered] == list(range(start, stop)), "a chunk is one contiguous range"
        stem = self.folder / f"chunk_{start}-{stop}"
        conversation_file.write(stem.with_suffix(".jsonl"), [a.row for a in answered if a.row is not None])
        meta = {
            "key": self.key, "start": start, "stop": stop, "ids": [a.id for a in answered],
            "stats": [a.stats for a in answered], "rows_sha256": sha256_file(stem.with_suffix(".jsonl")),
        }
        _write_json(stem.with_suffix(".json"), meta)

    def _open(self, meta_path: Path, start: int, stop: int) -> _Chunk:
        rows_path = meta_path.with_suffix(".jsonl")
        try:
            meta = json.loads(meta_path.read_text())
            ids, stats = meta["ids"], meta["stats"]
            if meta["key"] != self.key or (meta["start"], meta["stop"]) != (start, stop):
                raise StagedChunkError(f"{meta_path}: made for key {meta['key']}, rows {meta['start']}..{meta['stop']}")
            if len(ids) != stop - start or len(stats) != stop - start or any(set(s) != set(COUNTERS) for s in stats):
                raise StagedChunkError(f"{meta_path}: ids or counters do not cover rows {start}..{stop - 1}")
            if sha256_file(rows_path) != meta["rows_sha256"]:
                raise StagedChunkError(f"{rows_path}: changed since it was staged (sha256 differs)")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise err if isinstance(err, StagedChunkError) else StagedChunkError(f"{meta_path}: unreadable ({err})") from err
        return _Chunk(start, stop, rows_path, meta_path, ids, stats)

    def discard(self, chunk: _Chunk, reason: str) -> None:
        log.warning("discarding staged chunk: %s", reason)
        chunk.meta_path.unlink(missing_ok=True)
        chunk.rows_path.unlink(missing_ok=True)

    def chunks(self, rows: range) -> list[_Chunk]:
        """Checked chunks holding conversations of `rows`, in order; unusable ones are deleted."""
        found = []
        for meta_path in self.folder.glob("chunk_*.json"):
            match = _CHUNK.fullmatch(meta_path.name)
            if not match:
                continue
            start, stop = int(match[1]), int(match[2])
            if stop <= rows.start or start >= rows.stop:
                continue  # another shard's
            try:
                found.append(self._open(meta_path, start, stop))
            except StagedChunkError as err:
                log.warning("discarding staged chunk: %s", err)
                meta_path.unlink(missing_ok=True)
                meta_path.with_suffix(".jsonl").unlink(missing_ok=True)
        found.sort(key=lambda c: c.start)
        kept, covered = [], -1
        for chunk in found:
            if chunk.start < covered:  # never written so; skip rather than answer twice
                log.warning("ignoring staged chunk %s: it overlaps another", chunk.meta_path)
                continue
            kept.append(chunk)
            covered = chunk.stop
        return kept


def _staged_rows(chunk: _Chunk, rows: range) -> Iterator[dict]:
    """The chunk's kept rows inside `rows`, checked against the ids it was staged with."""
    expected = [
        (i, rid) for i, rid, s in zip(range(chunk.start, chunk.stop), chunk.ids, chunk.stats, strict=True) if s["rows_out"]
    ]
    got = 0
    for (i, rid), row in zip(expected, conversation_file.iter_rows(chunk.rows_path), strict=False):
        got += 1
        if row["id"] != rid:
            raise StagedChunkError(f"{chunk.rows_path}: row {got} has id {row['id']!r}, staged as {rid!r}; delete it and rerun")
        if i in rows:
            yield row
    if got != len(expected):
        raise StagedChunkError(f"{chunk.rows_path}: {got} rows, staged with {len(expected)}; delete it and rerun")


# ---------------------------------------------------------------- one shard


def regenerate_shard(
    target_dir: str | Path,
    conversations_path: str | Path,
    settings_path: str | Path,
    job: ShardJob,
    settings: RegenerateSettings,
    *,
    llm=None,
) -> dict:
    """Answer `job`'s shard of the prompts file into its folder (its `conversations.jsonl` and
    `summary.json`, published in one rename); return the summary.

    `settings_path` is `write_answer_settings`' file (the answer key, the row count). The job's
    staging folder (default `<out_dir's parent>/.staging`) keeps finished chunks across a killed
    job; conversations a valid chunk holds are not answered again.
    """
    shard, num_shards, staging_root = job.index, job.count, job.staging
    out_dir = Path(job.out_dir)
    answer = read_answer_settings(settings_path)
    key, num_rows = answer["key"], answer["prompts"]["rows"]
    rows = shard_rows(num_rows, shard, num_shards)
    staging = Staging(staging_root, key)
    staging.prepare()
    staged = _still_staged(staging, rows, conversations_path, f"{settings_path} says ({num_rows})")
    todo = [i for i in rows if i not in staged]
    log.info(
        "shard %d/%d: conversations %d..%d of %d (%d); %d already answered in %s, %d to answer; %s",
        shard, num_shards, rows.start, rows.stop - 1, num_rows, len(rows), len(staged), staging.folder, len(todo), settings,
    )

    progress = _Progress(len(rows), staged.values())
    load_seconds = seconds = 0.0
    if todo:
        own = llm is None
        load_started = time.monotonic()
        llm = llm or target_llm(target_dir, settings)
        load_seconds = time.monotonic() - load_started
        log.info("target %s loaded in %.1f s", target_dir, load_seconds)
        progress.started = time.monotonic()
        _answer_rows(llm, conversations_path, rows, set(todo), settings, staging, progress)
        seconds = time.monotonic() - progress.started
        if own:
            shutdown(llm)

    # Publish: every chunk's rows of this shard, in order, checked against the staged ids.
    chunks = staging.chunks(rows)
    held = [i for c in chunks for i in range(c.start, c.stop) if i in rows]
    if held != list(rows):
        raise RuntimeError(f"shard {shard}: staged chunks in {staging.folder} do not cover rows {rows.start}..{rows.stop - 1}")
    stats = _sum_stats(c.stats[i - c.start] for c in chunks for i in range(c.start, c.stop) if i in rows)
    summary = {
        "shard": shard, "num_shards": num_shards, "row_start": rows.start, "row_stop": rows.stop,
        "key": key, **stats, "answered": len(todo), "reused": len(rows) - len(todo),
        "load_seconds": round(load_seconds, 1), "seconds": round(seconds, 1),
        "tokens_per_second": progress.tokens_per_second if todo else None,
    }
    with atomic_dir(out_dir) as tmp:
        conversation_file.write(tmp / SHARD_CONVERSATIONS, (row for c in chunks for row in _staged_rows(c, rows)))
        _write_json(tmp / SHARD_SUMMARY, summary)
    log.info("published %s: %d rows (%d answered now, %d from staging)", out_dir, stats["rows_out"], len(todo), summary["reused"])
    _log_summary(stats, settings.max_new_tokens)
    return summary


def _still_staged(staging: Staging, rows: range, conversations_path: str | Path, expected: str) -> dict[int, dict]:
    """Row -> its stats, for the rows of `rows` a staged chunk holds whose ids still match the
    prompts file (streamed); a chunk holding another id is discarded, saying which row differs."""
    chunks = staging.chunks(rows)
    staged_id = {i: (c, rid) for c in chunks for i, rid in zip(range(c.start, c.stop), c.ids, strict=True) if i in rows}
    bad: dict[int, str] = {}
    count = 0
    for i, row in zip(rows, islice(conversation_file.iter_rows(conversations_path), rows.start, rows.stop)):
        count += 1
        if i in staged_id and staged_id[i][1] != row["id"]:
            bad.setdefault(id(staged_id[i][0]), f"{staged_id[i][0].meta_path}: row {i} is {staged_id[i][1]!r}, "
                                                 f"the prompts file has {row['id']!r}")
    if count != len(rows):
        raise ValueError(f"{conversations_path}: has fewer rows than {expected}; rerun regenerate_settings")
    for chunk in [c for c in chunks if id(c) in bad]:
        staging.discard(chunk, bad[id(chunk)])
    return {i: c.stats[i - c.start] for c in chunks if id(c) not in bad for i in range(c.start, c.stop) if i in rows}


def _answer_rows(llm, conversations_path, rows: range, todo: set[int], settings: RegenerateSettings,
                 staging: Staging, progress: _Progress) -> None:
    """Answer the `todo` rows of `rows`, streaming the prompts file again: one chunk of
    consecutive conversations in memory at a time, each staged once answered."""
    chat_template = _chat_template(settings)
    pending: list[tuple[int, _Conversation]] = []
    prompt_rows = islice(conversation_file.iter_rows(conversations_path), rows.start, rows.stop)
    for i, row in zip(rows, prompt_rows):
        if i not in todo:
            continue
        if pending and (len(pending) == settings.chunk_conversations or i != pending[-1][0] + 1):
            _answer_and_stage(llm, pending, settings, chat_template, staging, progress)
            pending = []
        pending.append((i, parse_conversation(row, f"{conversations_path} (row {i + 1})")))
    if pending:
        _answer_and_stage(llm, pending, settings, chat_template, staging, progress)


def _answer_and_stage(llm, pending, settings, chat_template, staging: Staging, progress: _Progress) -> None:
    indices = [i for i, _ in pending]
    answered = answer_conversations(llm, [c for _, c in pending], indices, settings, chat_template)
    staging.stage(answered)
    progress.add(answered)


# ---------------------------------------------------------------- merge


def merge_shards(
    shard_dirs: Sequence[str | Path], settings_path: str | Path, out_conversations: str | Path, out_summary: str | Path,
    out_answers: str | Path | None = None,
) -> dict:
    """The shards' rows, streamed in shard order (= the prompts file's order), into
    `out_conversations`; `out_summary` sums their counters; `out_answers` (`write_answers_digest`)
    is the merged file's sha256, what tokenization follows. Errors when the shards do not tile
    the prompts file or were made with other settings than `settings_path`."""
    answer = read_answer_settings(settings_path)
    summaries = []
    expected_start = 0
    for k, folder in enumerate(map(Path, shard_dirs)):
        try:
            s = json.loads((folder / SHARD_SUMMARY).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{folder / SHARD_SUMMARY}: unreadable ({err}); rerun regenerate_shard {k}") from err
        if s["key"] != answer["key"]:
            raise ValueError(f"{folder}: answered with key {s['key']}, {settings_path} has {answer['key']}; rerun regenerate_shard {k}")
        if (s["shard"], s["num_shards"], s["row_start"]) != (k, len(shard_dirs), expected_start):
            raise ValueError(
                f"{folder}: shard {s['shard']} of {s['num_shards']} from row {s['row_start']}, expected shard {k} of "
                f"{len(shard_dirs)} from row {expected_start}; rerun the regeneration shards"
            )
        expected_start = s["row_stop"]
        summaries.append(s)
    if expected_start != answer["prompts"]["rows"]:
        raise ValueError(f"the shards cover {expected_start} conversations, {settings_path} has {answer['prompts']['rows']}")
    stats = _sum_stats(summaries)
    if not stats["rows_out"]:
        max_model_len = answer["answers"].get("engine_outputs", {}).get("max_model_len")
        raise ValueError(f"no conversation fits max_model_len={max_model_len} (vllm.max_model_len, by default "
                         "tokenize.max_seq_len); raise it")

    def rows() -> Iterator[dict]:
        for folder, s in zip(map(Path, shard_dirs), summaries, strict=True):
            n = 0
            for row in conversation_file.iter_rows(folder / SHARD_CONVERSATIONS):
                n += 1
                yield row
            if n != s["rows_out"]:
                raise ValueError(f"{folder / SHARD_CONVERSATIONS}: {n} rows, its summary says {s['rows_out']}; rerun that shard")

    conversation_file.write(out_conversations, rows())
    sha256 = write_answers_digest(out_conversations, out_answers) if out_answers else sha256_file(out_conversations)
    answered = [s for s in summaries if s["answered"]]
    seconds = sum(s["seconds"] for s in answered)
    summary = {
        **stats,
        "seconds": round(seconds, 1),  # answering time summed over the shard jobs (GPU seconds)
        "tokens_per_second": round(sum(s["tokens_per_second"] * s["seconds"] for s in answered) / seconds, 1) if seconds else None,
        "shards": [{k: s[k] for k in ("shard", "row_start", "row_stop", "rows_out", "answered", "reused", "seconds",
                                     "tokens_per_second")} for s in summaries],
        "key": answer["key"],
        "settings": answer["answers"],
        "sha256": sha256,  # of the merged file
    }
    _write_json(out_summary, summary)
    log.info("merged %d shards into %s (sha256 %s)", len(shard_dirs), out_conversations, sha256[:12])
    _log_summary(stats, answer["answers"].get("max_new_tokens"))
    return summary


def write_answers_digest(conversations: str | Path, out: str | Path) -> str:
    """`out`: `<sha256>  <file name>` of the merged conversations (sha256sum's format, so `sha256sum
    -c` checks it from its folder); return the sha256. Its content changes only when the
    conversations do, which is what the tokenize rule follows (on GPUs another shard count or
    chunk size can give other answers: vLLM's can change with the batch)."""
    sha256 = sha256_file(conversations)
    with atomic_file(out, encoding="utf-8") as handle:
        handle.write(f"{sha256}  {Path(conversations).name}\n")
    return sha256
