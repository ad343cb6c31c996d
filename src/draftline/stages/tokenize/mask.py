"""One conversation's token ids and its assistant-only loss mask, from prefix renders
(tokenize_conversation), where its thinking is, and the mask under tokenize.reasoning (apply_reasoning)."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftline.stages.tokenize.template import (
    TemplateError,
    check_against_generation_tags,
    encode,
    has_generation_tags,
    render,
)


@dataclass
class Tokenized:
    input_ids: list[int]
    loss_mask: list[int]
    # 1 where an assistant turn's token is its thinking (THINK_OPEN ... THINK_CLOSE): trained in
    # loss_mask like the rest of the turn; tokenize.reasoning: exclude takes it out (`apply_reasoning`)
    reasoning: list[int] = field(default_factory=list)


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def tokenize_conversation(
    tokenizer,
    messages: list[dict],
    stop_ids: set[int],
    chat_template: str | None = None,
    row_id: str = "?",
    template_kwargs: dict | None = None,
    tools: list[dict] | None = None,
) -> Tokenized:
    """Token ids of the whole conversation, its assistant-only loss mask (1 = trained: each
    assistant turn, its thinking and tool-call text included; never a tool result) and where the
    thinking is; `template_kwargs` are the template's variables (target.chat_template_kwargs),
    `tools` the row's function schemas, rendered as vLLM's chat API renders them."""
    # A trailing prompt without an answer has nothing to train: render up to the last answer.
    answered = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not answered:
        return Tokenized([], [])
    messages = messages[: answered[-1] + 1]
    template_kwargs = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
    full_ids, _ = encode(tokenizer, render(tokenizer, messages, chat_template, False, template_kwargs))
    mask, reasoning = [0] * len(full_ids), [0] * len(full_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt_text = render(tokenizer, messages[:i], chat_template, True, template_kwargs)
        prompt_ids, _ = encode(tokenizer, prompt_text)
        turn_text = render(tokenizer, messages[: i + 1], chat_template, False, template_kwargs)
        turn_ids, offsets = encode(tokenizer, turn_text)
        if turn_ids[: len(prompt_ids)] != prompt_ids or full_ids[: len(turn_ids)] != turn_ids:
            raise TemplateError(
                f"row {row_id!r}, assistant message {i}: the chat template is not prefix-stable (rendering the "
                "conversation up to this answer does not tokenize to a prefix of the whole conversation), so "
                "the answer's tokens cannot be located. Set target.chat_template to a template that renders "
                "earlier turns the same way whatever follows them (one that drops earlier turns' thinking, "
                "as Qwen3's does, is not)."
            )
        start, end = len(prompt_ids), len(turn_ids)
        content_end = _content_end_token(turn_text, offsets, start, end, message["content"])
        if message.get("truncated"):
            stop = content_end  # the template's end-of-turn was never emitted by the target
        else:
            # train through the first stop token after the content (and after the turn's tool calls);
            # template text after it is not the target's
            stop = next((k + 1 for k in range(content_end, end) if turn_ids[k] in stop_ids), content_end)
        opened = prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)  # the prompt opens the thinking
        for k in range(start, stop):
            mask[k] = 1
        for k in _thinking_tokens(turn_text, offsets, range(start, stop), opened):
            reasoning[k] = 1
    if has_generation_tags(chat_template or tokenizer.chat_template) and not any(m.get("truncated") for m in messages):
        check_against_generation_tags(tokenizer, messages, chat_template, full_ids, mask, row_id, template_kwargs)
    return Tokenized(full_ids, mask, reasoning)


def _thinking_tokens(text: str, offsets: list[tuple[int, int]], span: range, opened: bool) -> list[int]:
    """The tokens of `span` inside a THINK_OPEN ... THINK_CLOSE block of `text` (tags included;
    `opened`: the block began in the prompt, as templates that pre-fill THINK_OPEN do; a block
    never closed, an answer cut while thinking, runs to the span's end)."""
    if not span:
        return []
    at, stop_char = offsets[span.start][0], offsets[span.stop - 1][1]
    blocks = []
    while at < stop_char:
        begin = at if opened else text.find(THINK_OPEN, at, stop_char)
        if begin < 0:
            break
        close = text.find(THINK_CLOSE, begin, stop_char)
        finish = stop_char if close < 0 else close + len(THINK_CLOSE)
        blocks.append((begin, finish))
        at, opened = finish, False
    return [k for k in span if any(offsets[k][0] < b and offsets[k][1] > a for a, b in blocks)]


def apply_reasoning(tok: Tokenized, reasoning: str) -> Tokenized:
    """The loss mask under tokenize.reasoning: `train` keeps the thinking in it, `exclude` takes it out."""
    if reasoning == "train" or not any(tok.reasoning):
        return tok
    mask = [m and not r for m, r in zip(tok.loss_mask, tok.reasoning, strict=True)]
    return Tokenized(tok.input_ids, [int(m) for m in mask], tok.reasoning)


def _content_end_token(text: str, offsets: list[tuple[int, int]], start: int, end: int, content: str) -> int:
    """Index of the first token of turn span [start, end) that lies after the answer's content."""
    span_start = offsets[start][0] if start < end else len(text)
    # templates may trim content, or render an answer's <think> block their own way (its answer stays)
    needles = [content, content.strip(), content.rpartition(THINK_CLOSE)[2].strip()]
    needle = next((n for n in needles if n in text[span_start:]), None)
    if needle is None:
        # content rewritten by the template: treat the whole span as content
        return end
    content_end = text.find(needle, span_start) + len(needle)
    return next((k for k in range(start, end) if offsets[k][0] >= content_end and offsets[k][1] > offsets[k][0]), end)
