"""Render conversations with the target's chat template and mask the loss to assistant tokens.

Most chat templates (SmolLM2's ChatML among them) have no `{% generation %}` tags, so
`return_assistant_tokens_mask` cannot be used. The mask comes from prefix renders instead:
for assistant turn i, the tokens that `messages[:i+1]` adds to `messages[:i]` rendered with the
generation prompt are that turn's. Trained: the answer's content and the end-of-turn token the
target emits to stop (the draft must learn to stop); not trained: system/user/template tokens,
template text after the end-of-turn token, and for an answer cut at max_new_tokens
(`"truncated": true`) the end-of-turn token the template appends (the target never emitted it).
Templates with generation tags get the same mask, cross-checked against the template's own.

The rows then go through speculators' own preprocessing (pretokenized pass-through) to the
arrow dataset and token_freq.pt that its trainer and vocab code read.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.planning.config_schema import default

log = logging.getLogger(__name__)


class TemplateError(ValueError):
    """The chat template does not render in a way an assistant-only mask can be derived from."""


@dataclass
class Tokenized:
    input_ids: list[int]
    loss_mask: list[int]
    # 1 where an assistant turn's token is its thinking (THINK_OPEN ... THINK_CLOSE): trained in
    # loss_mask like the rest of the turn; tokenize.reasoning: exclude takes it out (`apply_reasoning`)
    reasoning: list[int] = field(default_factory=list)


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def stop_token_ids(target_dir: str | Path, tokenizer) -> set[int]:
    """Tokens the target ends an answer with: generation_config's eos ids and the tokenizer's eos."""
    ids = set()
    path = Path(target_dir) / "generation_config.json"
    if path.exists():
        eos = json.loads(path.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def has_generation_tags(template: str | None) -> bool:
    return template is not None and "{% generation %}" in template.replace("{%-", "{%").replace("-%}", "%}")


def _encode(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    # The template writes special tokens (BOS etc.) itself; adding them again would double them.
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _render(tokenizer, messages: list[dict], chat_template: str | None, add_generation_prompt: bool,
            template_kwargs: dict | None = None) -> str:
    return tokenizer.apply_chat_template(
        conversation_file.template_messages(messages),  # tool calls and thinking as vLLM's chat() passes them
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        **(template_kwargs or {}),  # target.chat_template_kwargs (and the row's tools), as vLLM's chat() gets them
    )


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
    full_ids, _ = _encode(tokenizer, _render(tokenizer, messages, chat_template, False, template_kwargs))
    mask, reasoning = [0] * len(full_ids), [0] * len(full_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt_text = _render(tokenizer, messages[:i], chat_template, True, template_kwargs)
        prompt_ids, _ = _encode(tokenizer, prompt_text)
        turn_text = _render(tokenizer, messages[: i + 1], chat_template, False, template_kwargs)
        turn_ids, offsets = _encode(tokenizer, turn_text)
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
        _check_against_generation_tags(tokenizer, messages, chat_template, full_ids, mask, row_id, template_kwargs)
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


def _check_against_generation_tags(tokenizer, messages, chat_template, full_ids, mask, row_id, template_kwargs=None) -> None:
    enc = tokenizer.apply_chat_template(
        conversation_file.template_messages(messages),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        chat_template=chat_template,
        **(template_kwargs or {}),
    )
    if list(enc["input_ids"]) != full_ids or list(enc["assistant_masks"]) != mask:
        raise TemplateError(
            f"row {row_id!r}: the chat template's {{% generation %}} mask disagrees with the prefix-render mask; "
            "check that the generation block covers exactly the answer and its end-of-turn token"
        )


@dataclass(frozen=True)
class TokenizeSettings:
    max_seq_len: int = default("tokenize", "max_seq_len")
    min_trainable_tokens: int = default("tokenize", "min_trainable_tokens")
    chat_template: str | None = None  # path to a Jinja template replacing the tokenizer's
    # target.chat_template_kwargs: the template's variables (e.g. enable_thinking)
    chat_template_kwargs: dict = field(default_factory=dict)
    trust_remote_code: bool = default("target", "trust_remote_code")
    reasoning: str = default("tokenize", "reasoning")  # train | exclude: an answer's thinking in the loss mask


def new_stats() -> dict:
    return {
        "rows_in": 0,
        "rows_truncated": 0,
        "tokens_cut_by_truncation": 0,
        "trainable_tokens_cut_by_truncation": 0,
        "rows_dropped_few_trainable_tokens": 0,
        "answers_truncated_at_generation": 0,
        "rows": 0,
        "total_tokens": 0,
        "trainable_tokens": 0,
        # assistant tokens (kept rows, within max_seq_len) of the answers' thinking and of the rest
        # of the answers (tool-call text included); trained: both, or only the answers (tokenize.reasoning)
        "reasoning_tokens": 0,
        "answer_tokens": 0,
        "rows_with_reasoning": 0,
    }


def iter_tokenized(tokenizer, rows: Iterable[dict], settings: TokenizeSettings, stop_ids: set[int],
                   chat_template: str | None, stats: dict, ids: list[str]) -> Iterator[dict]:
    """Tokenize, truncate at max_seq_len and filter, one row at a time: yields each kept row's
    `input_ids` and `loss_mask`, appends its id to `ids` and counts into `stats` (`new_stats`)."""
    for row in rows:
        stats["rows_in"] += 1
        stats["answers_truncated_at_generation"] += sum(bool(m.get("truncated")) for m in row["messages"])
        full = tokenize_conversation(tokenizer, row["messages"], stop_ids, chat_template, row_id=row["id"],
                                     template_kwargs=settings.chat_template_kwargs, tools=row.get("tools"))
        tok = apply_reasoning(full, settings.reasoning)
        if len(tok.input_ids) > settings.max_seq_len:
            stats["rows_truncated"] += 1
            stats["tokens_cut_by_truncation"] += len(tok.input_ids) - settings.max_seq_len
            stats["trainable_tokens_cut_by_truncation"] += sum(tok.loss_mask[settings.max_seq_len :])
            n = settings.max_seq_len
            full = Tokenized(full.input_ids[:n], full.loss_mask[:n], full.reasoning[:n])
            tok = Tokenized(tok.input_ids[:n], tok.loss_mask[:n], tok.reasoning[:n])
        trainable = sum(tok.loss_mask)
        if trainable < settings.min_trainable_tokens:
            stats["rows_dropped_few_trainable_tokens"] += 1
            log.warning("id %r dropped: %d trainable tokens < tokenize.min_trainable_tokens=%d",
                        row["id"], trainable, settings.min_trainable_tokens)
            continue
        stats["rows"] += 1
        stats["total_tokens"] += len(tok.input_ids)
        stats["trainable_tokens"] += trainable
        thinking = sum(full.reasoning)
        stats["reasoning_tokens"] += thinking
        stats["answer_tokens"] += sum(full.loss_mask) - thinking
        stats["rows_with_reasoning"] += thinking > 0
        ids.append(row["id"])
        yield {"input_ids": tok.input_ids, "loss_mask": tok.loss_mask}


ARROW_BATCH_ROWS = 1000


def write_rows_arrow(path: Path, rows: Iterable[dict]) -> str:
    """`input_ids` and `loss_mask` rows into an Arrow stream file (the format `Dataset.from_file`
    maps), `ARROW_BATCH_ROWS` rows at a time, so no more than that is held; returns the sha256 of
    the rows written (the dataset's fingerprint: the same rows give the same one)."""
    import hashlib
    from array import array

    import pyarrow as pa

    schema = pa.schema([("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int64()))])
    digest = hashlib.sha256()
    batch: list[dict] = []

    def flush(writer) -> None:
        for row in batch:
            for key in ("input_ids", "loss_mask"):
                values = array("q", row[key])
                digest.update(len(values).to_bytes(8, "little"))
                digest.update(values.tobytes())
        writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
        batch.clear()

    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for row in rows:
            batch.append(row)
            if len(batch) >= ARROW_BATCH_ROWS:
                flush(writer)
        if batch:
            flush(writer)
    return digest.hexdigest()


def load_tokenizer(target_dir: str | Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), trust_remote_code=trust_remote_code)
    if not tokenizer.is_fast:
        raise ValueError(f"{target_dir}: the tokenizer is not a fast tokenizer; the loss mask needs its offset mapping")
    return tokenizer


def tokenize(
    target_dir: str | Path,
    conversations_path: str | Path,
    out_dataset: str | Path,
    out_token_freq: str | Path,
    out_summary: str | Path,
    settings: TokenizeSettings,
) -> dict:
    """Conversations -> speculators' arrow dataset, token_freq.pt and summary.json, published atomically.

    Dataset row i is the i-th kept conversation in input order (its id is `ids[i]` in summary.json).
    """
    import tempfile

    from datasets import Dataset
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    tokenizer = load_tokenizer(target_dir, settings.trust_remote_code)
    chat_template = Path(settings.chat_template).read_text(encoding="utf-8") if settings.chat_template else None
    if chat_template is None and tokenizer.chat_template is None:
        raise ValueError(f"{target_dir}: the tokenizer has no chat template; set target.chat_template to a Jinja file")
    stop_ids = stop_token_ids(target_dir, tokenizer)
    out_dataset, out_token_freq, out_summary = Path(out_dataset), Path(out_token_freq), Path(out_summary)
    out_dataset.parent.mkdir(parents=True, exist_ok=True)
    # A fresh staging folder: speculators silently reuses an existing token_freq.pt.
    staging = Path(tempfile.mkdtemp(prefix=".tokenize.tmp-", dir=out_dataset.parent))
    try:
        # Streamed: conversations are read, tokenized and written to an Arrow file one batch at
        # a time; speculators' preprocessing then takes it a part at a time (speculators_dataset)
        # and every later step maps the files from disk.
        stats, ids = new_stats(), []
        rows = conversation_file.iter_rows(conversations_path)
        fingerprint = write_rows_arrow(
            staging / "rows.arrow", iter_tokenized(tokenizer, rows, settings, stop_ids, chat_template, stats, ids)
        )
        if not stats["rows"]:
            raise ValueError(
                f"{conversations_path}: no conversation has >= {settings.min_trainable_tokens} trainable (assistant) tokens "
                f"within max_seq_len={settings.max_seq_len}; see the counts above"
            )
        # The fingerprint from the rows' content, not the staging folder's random name, so the
        # same conversations give the same dataset fingerprint (hidden-state staging keys use it).
        tokenized = Dataset(Dataset.from_file(str(staging / "rows.arrow")).data, fingerprint=fingerprint)
        dataset = speculators_dataset(tokenized, tokenizer, settings, staging / "parts")
        if len(dataset) != stats["rows"]:
            raise RuntimeError(f"speculators' preprocessing kept {len(dataset)} of {stats['rows']} rows; expected all")
        save_token_frequency_distribution(dataset, staging / "token_freq.pt")
        dataset.save_to_disk(str(staging / "dataset"))
        _verify(staging, tokenized)
        del dataset, tokenized
        summary = {**stats, "max_seq_len": settings.max_seq_len, "min_trainable_tokens": settings.min_trainable_tokens,
                   "reasoning": settings.reasoning, "ids": ids}
        (staging / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        # dataset and token_freq first, summary last: a finished summary means the rest is there
        _replace(staging / "dataset", out_dataset)
        _replace(staging / "token_freq.pt", out_token_freq)
        _replace(staging / "summary.json", out_summary)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info(
        "%d rows, %d tokens, %d trainable; %d rows truncated at max_seq_len=%d (%d tokens, %d trainable cut); "
        "%d rows dropped with < %d trainable tokens; %d answers were truncated at generation",
        stats["rows"], stats["total_tokens"], stats["trainable_tokens"], stats["rows_truncated"], settings.max_seq_len,
        stats["tokens_cut_by_truncation"], stats["trainable_tokens_cut_by_truncation"],
        stats["rows_dropped_few_trainable_tokens"], settings.min_trainable_tokens, stats["answers_truncated_at_generation"],
    )
    return summary


# speculators' preprocessing keeps its output in memory (`map(..., keep_in_memory=True)`): fed
# this many tokens at a time, each part is saved to disk before the next, so the step's memory
# stays bounded whatever the dataset's size (int64 ids and mask: 16 bytes a token, ~128 MB a part).
PART_TOKENS = 8_000_000


def part_bounds(lengths: Iterable[int], part_tokens: int = PART_TOKENS) -> list[tuple[int, int]]:
    """Contiguous [start, stop) row ranges covering every row, each of at most `part_tokens`
    tokens (a longer row is a part of its own)."""
    bounds, start, tokens, rows = [], 0, 0, 0
    for rows, length in enumerate(lengths, start=1):
        if tokens and tokens + length > part_tokens:
            bounds.append((start, rows - 1))
            start, tokens = rows - 1, 0
        tokens += length
    if rows > start:
        bounds.append((start, rows))
    return bounds


def speculators_dataset(tokenized, tokenizer, settings: TokenizeSettings, parts_dir: Path, part_tokens: int | None = None):
    """The rows through speculators' own preprocessing (its pass-through for rows that already
    hold input_ids and loss_mask: its clipping and filtering find nothing left to do, done and
    counted above, and it does not shuffle, so row i stays the i-th kept conversation), about
    `part_tokens` (PART_TOKENS) tokens at a time: each part is saved under `parts_dir` and the
    parts are concatenated memory-mapped. One part is the whole dataset in one call."""
    import pyarrow.compute as pc
    from datasets import concatenate_datasets, load_from_disk
    from speculators.data_generation.preprocessing import build_speculator_training_dataset

    def preprocess(rows):
        return build_speculator_training_dataset(
            rows, tokenizer, max_length=settings.max_seq_len, num_proc=1,
            minimum_valid_tokens=settings.min_trainable_tokens,
        )

    lengths = pc.list_value_length(tokenized.data.column("input_ids")).to_pylist()
    bounds = part_bounds(lengths, part_tokens or PART_TOKENS)
    if len(bounds) == 1:
        return preprocess(tokenized)
    parts = []
    for k, (start, stop) in enumerate(bounds):
        staging_part = str(parts_dir / f"part_{k:05d}")  # parts_dir is in tokenize's staging folder
        preprocess(tokenized.select(range(start, stop))).save_to_disk(staging_part)  # the part leaves memory here
        parts.append(load_from_disk(staging_part))
    log.info("speculators' preprocessing in %d parts of <= %d tokens", len(parts), part_tokens or PART_TOKENS)
    return concatenate_datasets(parts)


def _verify(staging: Path, tokenized) -> None:
    """Read back what was written: every row's ids and mask as tokenized (`tokenized`, the rows
    file), frequencies of trained tokens only; row by row, nothing held whole."""
    from collections import Counter

    import torch
    from datasets import load_from_disk

    dataset = load_from_disk(str(staging / "dataset")).with_format(None)  # plain lists, not tensors
    if len(dataset) != len(tokenized):
        raise RuntimeError(f"written dataset has {len(dataset)} rows, expected {len(tokenized)}")
    expected = Counter()
    for i, (written, row) in enumerate(zip(dataset, tokenized.with_format(None), strict=True)):
        same = written["input_ids"] == row["input_ids"] and written["loss_mask"] == row["loss_mask"]
        if not same or written["seq_len"] != len(row["input_ids"]):
            raise RuntimeError(f"written dataset row {i} differs from the tokenized conversation")
        expected.update(t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    freq = torch.load(staging / "token_freq.pt", weights_only=True)
    if dict(expected) != freq:
        raise RuntimeError("token_freq.pt does not match the trained tokens of the dataset")


def _replace(src: Path, dst: Path) -> None:
    import os

    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(src, dst)
