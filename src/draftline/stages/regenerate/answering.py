"""Answering conversations with the target, turn by turn: each round one `LLM.chat` call per tool
set, every prompt rendered with the chat template (its variables, the row's tools) to fit
max_model_len, the target's tool calls given the data's results back (answer_conversations)."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.stages.regenerate.conversation import Conversation
from draftline.stages.regenerate.counters import COUNTERS, Answered, LogProgress
from draftline.stages.regenerate.settings import RegenerateSettings
from draftline.stages.regenerate.tool_calls import ToolCalls

log = logging.getLogger(__name__)

# Left free after each answer for the end-of-turn tokens the template appends, so the rendered
# conversation still fits tokenize.max_seq_len and tokenization cuts nothing the target wrote.
END_OF_TURN_ROOM = 8


def _prompt_len(tokenizer, messages: list[dict], chat_template: str | None, template_kwargs: dict | None = None,
                tools: list[dict] | None = None) -> int:
    # Rendered to text then tokenized without special tokens, as vLLM's chat() does.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=chat_template,
                                         tools=tools, **(template_kwargs or {}))
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def chat_template_text(settings: RegenerateSettings) -> str | None:
    return Path(settings.chat_template).read_text(encoding="utf-8") if settings.chat_template else None


def answer_conversations(
    llm, conversations: Sequence[Conversation], indices: Sequence[int], settings: RegenerateSettings,
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
            outputs = llm.chat([m for _, m, _ in group], [p for _, _, p in group], use_tqdm=LogProgress,
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


def _take(conv: Conversation, output, s: dict, capped: bool, calls: ToolCalls) -> None:
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
