"""Assistant-only loss masks, checked token by token against the rendered text."""

import json
from collections import Counter

import pytest
import torch

from draftline.settings import default
from draftline.stages.tokenize import (
    TemplateError,
    TokenizeSettings,
    load_tokenizer,
    stop_token_ids,
    tokenize,
    tokenize_conversation,
)

END = "<|im_end|>"

MULTI_TURN = [
    {"role": "system", "content": "You are terse. Réponds en français."},
    {"role": "user", "content": "Unicode: café, naïve, Grüße, 日本語 🙂?"},
    {"role": "assistant", "content": "Oui: café 🙂, 日本語 and ß."},
    {"role": "user", "content": "And a second question?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
]


def expected_char_mask(text: str, messages: list[dict]) -> list[bool]:
    """Oracle from the rendered text alone: each answer's characters and the end-of-turn marker after it."""
    chars = [False] * len(text)
    pos = 0
    for m in messages:
        start = text.index(m["content"], pos)
        pos = start + len(m["content"])
        if m["role"] != "assistant":
            continue
        end = pos if m.get("truncated") else pos + len(END)
        assert m.get("truncated") or text[pos:end] == END
        chars[start:end] = [True] * (end - start)
    return chars


def assert_mask_matches_text(tokenizer, messages, tokenized):
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert tokenized.input_ids == enc["input_ids"], "the conversation must tokenize exactly as its rendered text"
    chars = expected_char_mask(text, messages)
    for k, ((a, b), bit) in enumerate(zip(enc["offset_mapping"], tokenized.loss_mask, strict=True)):
        piece = text[a:b]
        expected = all(chars[a:b])
        assert bit == expected, f"token {k} {piece!r}: mask {bit}, expected {int(expected)}"
    # everything the user/system wrote and the template added is out of the mask
    trained = tokenizer.decode([t for t, m in zip(tokenized.input_ids, tokenized.loss_mask) if m])
    for m in messages:
        if m["role"] != "assistant":
            assert m["content"] not in trained
    assert "<|im_start|>" not in trained and "assistant\n" not in trained


@pytest.fixture(scope="module")
def chatml(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    return tokenizer, stop_token_ids(tiny_model, tokenizer)


def test_chatml_without_tags_masks_only_answers_and_their_end_token(chatml):
    tokenizer, stop = chatml
    assert "{% generation %}" not in tokenizer.chat_template
    tokenized = tokenize_conversation(tokenizer, MULTI_TURN, stop)
    assert_mask_matches_text(tokenizer, MULTI_TURN, tokenized)
    # both answers end with a trained <|im_end|>; the newline the template writes after it is not trained
    end_id = tokenizer.convert_tokens_to_ids(END)
    trained_ends = [k for k, t in enumerate(tokenized.input_ids) if t == end_id and tokenized.loss_mask[k]]
    assert len(trained_ends) == 2
    assert all(tokenized.loss_mask[k + 1] == 0 for k in trained_ends)


def test_truncated_answer_keeps_template_end_out_of_the_mask(chatml):
    tokenizer, stop = chatml
    messages = [*MULTI_TURN[:-1], {**MULTI_TURN[-1], "truncated": True}]
    tokenized = tokenize_conversation(tokenizer, messages, stop)
    assert_mask_matches_text(tokenizer, messages, tokenized)
    assert tokenized.input_ids[-2] == tokenizer.convert_tokens_to_ids(END)
    assert tokenized.loss_mask[-3:] == [1, 0, 0]  # last content token in; <|im_end|> and "\n" out


def test_trailing_user_turn_is_not_rendered(chatml):
    tokenizer, stop = chatml
    with_trailing = tokenize_conversation(tokenizer, [*MULTI_TURN, {"role": "user", "content": "unanswered"}], stop)
    assert with_trailing == tokenize_conversation(tokenizer, MULTI_TURN, stop)
    assert tokenize_conversation(tokenizer, MULTI_TURN[:2], stop).input_ids == []


def test_generation_tag_template_agrees_with_prefix_mask(tiny_model_generation_tags):
    tokenizer = load_tokenizer(tiny_model_generation_tags)
    assert "{% generation %}" in tokenizer.chat_template
    tokenized = tokenize_conversation(tokenizer, MULTI_TURN, stop_token_ids(tiny_model_generation_tags, tokenizer))
    template_mask = tokenizer.apply_chat_template(
        MULTI_TURN, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert template_mask["input_ids"] == tokenized.input_ids
    assert template_mask["assistant_masks"] == tokenized.loss_mask
    assert_mask_matches_text(tokenizer, MULTI_TURN, tokenized)


def test_template_that_rerenders_history_fails_naming_the_row(chatml):
    tokenizer, stop = chatml
    # renders the last message differently, so a prefix render is not a prefix of the whole
    unstable = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% if loop.last %} (latest){% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="row 'conv-7'.*prefix"):
        tokenize_conversation(tokenizer, MULTI_TURN, stop, chat_template=unstable, row_id="conv-7")


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def test_tokenize_writes_speculators_dataset_and_counts_what_it_cuts(tiny_model, tmp_path, monkeypatch):
    from datasets import load_from_disk

    import draftline.stages.tokenize

    # rows stream to disk in batches: one row per batch here, so the order across batches shows
    monkeypatch.setattr(draftline.stages.tokenize.arrow, "ARROW_BATCH_ROWS", 1)

    long_answer = "The sea is wide and blue and deep. " * 40
    rows = [
        {"id": "a", "source": "s", "messages": MULTI_TURN},
        {"id": "long", "source": "s",
         "messages": [{"role": "user", "content": "Write a poem."}, {"role": "assistant", "content": long_answer}]},
        {"id": "no-answer", "source": "s", "messages": [{"role": "user", "content": "Hello?"}]},
        {"id": "short", "source": "s",
         "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "ok", "truncated": True}]},
    ]
    conversations = tmp_path / "conversations.jsonl"
    write_rows(conversations, rows)
    out = tmp_path / "tokenized"
    settings = TokenizeSettings(max_seq_len=128, min_trainable_tokens=3)
    summary = tokenize(tiny_model, conversations, out / "dataset", out / "token_freq.pt", out / "summary.json", settings)

    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["rows_in"] == 4
    assert summary["ids"] == ["a", "long"]  # dataset row i is ids[i], input order kept
    assert summary["rows_truncated"] == 1 and summary["tokens_cut_by_truncation"] > 0
    assert summary["trainable_tokens_cut_by_truncation"] > 0
    assert summary["rows_dropped_few_trainable_tokens"] == 2  # no answer; one truncated 1-token answer
    assert summary["answers_truncated_at_generation"] == 1

    dataset = load_from_disk(str(out / "dataset")).with_format(None)
    assert set(dataset.column_names) == {"input_ids", "loss_mask", "seq_len"}
    assert dataset["seq_len"][1] == 128
    assert summary["total_tokens"] == sum(dataset["seq_len"])
    assert summary["trainable_tokens"] == sum(sum(m) for m in dataset["loss_mask"])

    # token_freq counts exactly the trained tokens
    expected = Counter()
    for ids, mask in zip(dataset["input_ids"], dataset["loss_mask"]):
        expected.update(t for t, m in zip(ids, mask) if m)
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    assert freq == dict(expected)
    tokenizer = load_tokenizer(tiny_model)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") not in freq

    # the same conversations give the same dataset fingerprint (hidden-state staging keys use it)
    again = tmp_path / "again"
    tokenize(tiny_model, conversations, again / "dataset", again / "token_freq.pt", again / "summary.json", settings)
    fingerprint = load_from_disk(str(out / "dataset"))._fingerprint
    assert load_from_disk(str(again / "dataset"))._fingerprint == fingerprint

    # a second run on other data recounts (speculators would silently reuse an existing file)
    write_rows(conversations, rows[1:2])
    tokenize(tiny_model, conversations, out / "dataset", out / "token_freq.pt", out / "summary.json", settings)
    assert torch.load(out / "token_freq.pt", weights_only=True) != freq
    assert load_from_disk(str(out / "dataset"))._fingerprint != fingerprint
    assert [p.name for p in tmp_path.joinpath("tokenized").iterdir() if p.name.startswith(".")] == []


def test_a_dataset_preprocessed_in_parts_is_the_same_dataset(tiny_model, tmp_path, monkeypatch):
    """speculators' preprocessing holds its output in memory, so tokenize feeds it PART_TOKENS
    tokens at a time (a part saved before the next): the rows, their order, the columns and
    format speculators' Trainer reads, and token_freq.pt are those of one part."""
    from datasets import load_from_disk

    import draftline.stages.tokenize

    answers = ["Paris.", "The sea is wide and blue. " * 3, "Four.", "Red, green and blue.", "Hola."]
    rows = [{"id": f"r{i}", "source": "s", "messages": [{"role": "user", "content": f"Question {i}?"},
                                                         {"role": "assistant", "content": a}]}
            for i, a in enumerate(answers)]
    conversations = tmp_path / "conversations.jsonl"
    write_rows(conversations, rows)
    settings = TokenizeSettings(max_seq_len=128, min_trainable_tokens=1)

    def run(name):
        out = tmp_path / name
        tokenize(tiny_model, conversations, out / "dataset", out / "token_freq.pt", out / "summary.json", settings)
        return out

    whole = run("whole")
    monkeypatch.setattr(draftline.stages.tokenize.parts, "PART_TOKENS", 40)  # every row or two a part
    lengths = load_from_disk(str(whole / "dataset")).with_format(None)["seq_len"]
    assert len(draftline.stages.tokenize.part_bounds(lengths, 40)) >= 3
    parts = run("parts")

    one, many = load_from_disk(str(whole / "dataset")), load_from_disk(str(parts / "dataset"))
    assert many.format == one.format and many.format["type"] == "torch"  # what the Trainer's loader gets
    assert many.features == one.features and len(many) == len(one) == len(rows)
    assert many.with_format(None).to_list() == one.with_format(None).to_list()
    assert torch.load(parts / "token_freq.pt", weights_only=True) == torch.load(whole / "token_freq.pt", weights_only=True)
    assert json.loads((parts / "summary.json").read_text()) == json.loads((whole / "summary.json").read_text())
    assert not [p for p in parts.iterdir() if p.name.startswith(".")]  # the parts went with the staging folder


def test_nothing_trainable_is_an_error(tiny_model, tmp_path):
    conversations = tmp_path / "c.jsonl"
    write_rows(conversations, [{"id": "x", "source": "s", "messages": [{"role": "user", "content": "Hi"}]}])
    with pytest.raises(ValueError, match="no conversation has >= 1 trainable"):
        tokenize(tiny_model, conversations, tmp_path / "d", tmp_path / "f.pt", tmp_path / "s.json", TokenizeSettings())
    assert not (tmp_path / "d").exists() and not (tmp_path / "s.json").exists()


def test_empty_answer_trains_only_its_end_token(chatml):
    tokenizer, stop = chatml
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]
    tokenized = tokenize_conversation(tokenizer, messages, stop)
    trained = [t for t, m in zip(tokenized.input_ids, tokenized.loss_mask) if m]
    assert trained == [tokenizer.convert_tokens_to_ids(END)]


def test_chat_template_kwargs_reach_the_template_and_stay_out_of_the_loss(chatml):
    """target.chat_template_kwargs (Qwen3's enable_thinking here) render every turn as the target
    sees it: the empty think block opens each answer, and only the answers are trained."""
    from draftline.stages.tokenize import iter_tokenized, new_stats
    from draftline.testing.tiny_model import CHATML_THINKING_TEMPLATE, NO_THINK

    tokenizer, stop = chatml
    rows = [{"id": "two-turns", "messages": MULTI_TURN}]

    def tokenized(**kwargs):
        settings = TokenizeSettings(max_seq_len=512, min_trainable_tokens=1, **kwargs)
        kept = list(iter_tokenized(tokenizer, rows, settings, stop, CHATML_THINKING_TEMPLATE, new_stats(), []))
        ids, mask = kept[0]["input_ids"], kept[0]["loss_mask"]
        return tokenizer.decode(ids), [t for t, m in zip(ids, mask) if m]

    plain_text, plain_trained = tokenized()
    text, trained = tokenized(chat_template_kwargs={"enable_thinking": False})
    assert NO_THINK not in plain_text
    assert text.count("<|im_start|>assistant\n" + NO_THINK) == 2  # both answers, as vLLM will render them
    assert text == tokenizer.apply_chat_template(MULTI_TURN, tokenize=False, chat_template=CHATML_THINKING_TEMPLATE,
                                                 enable_thinking=False)
    assert trained == plain_trained  # the answers and their end-of-turn tokens, never the think block
    assert "<think>" not in tokenizer.decode(trained)


# ------------------------------------------------------------------------- thinking (reasoning)

THINKING_ROWS = [
    # a dataset answer whose thinking is its own field (speculators' `reasoning_content`)
    {"id": "field", "messages": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome.", "reasoning_content": "Italy: Rome."}]},
    # one whose thinking is written into its content, as a thinking target generates it
    {"id": "inline", "messages": [
        {"role": "user", "content": "Write a short poem about the sea."},
        {"role": "assistant", "content": "<think>\nWide, blue, deep.\n</think>\n\nThe sea is wide and blue."}]},
    {"id": "plain", "messages": [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi."}]},
]


@pytest.fixture(scope="module")
def thinking_runs(tiny_model_thinking, tmp_path_factory):
    """The rows through the whole tokenize step (regenerate.enabled: false: the dataset's own
    thinking answers) on a target whose template thinks, once per tokenize.reasoning setting."""
    from datasets import load_from_disk

    folder = tmp_path_factory.mktemp("thinking")
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in THINKING_ROWS))
    tokenizer = load_tokenizer(tiny_model_thinking)
    runs = {}
    for reasoning in ("train", "exclude"):
        out = folder / reasoning
        summary = tokenize(tiny_model_thinking, folder / "rows.jsonl", out / "ds", out / "freq.pt", out / "s.json",
                           TokenizeSettings(max_seq_len=512, reasoning=reasoning))
        dataset = load_from_disk(str(out / "ds")).with_format(None)
        trained = {rid: tokenizer.decode([t for t, m in zip(ids, mask) if m])
                   for rid, ids, mask in zip(summary["ids"], dataset["input_ids"], dataset["loss_mask"])}
        runs[reasoning] = summary, trained, dataset["input_ids"], torch.load(out / "freq.pt")
    return runs


def test_reasoning_train_keeps_the_thinking_in_the_loss_as_speculators_preprocessing_does(thinking_runs):
    """The default (speculators 0.9.0 masks the whole rendered assistant turn from its render
    boundary): each answer is trained with its <think> block, as the template renders it."""
    summary, trained, _, _ = thinking_runs["train"]
    assert default("tokenize", "reasoning") == "train" == summary["reasoning"]
    assert trained["field"] == ("<think>\nThe capital of France is Paris.\n</think>\n\nParis.<|im_end|>"
                                "<think>\nItaly: Rome.\n</think>\n\nRome.<|im_end|>")
    assert trained["inline"] == "<think>\nWide, blue, deep.\n</think>\n\nThe sea is wide and blue.<|im_end|>"
    assert trained["plain"] == "Hi.<|im_end|>"


def test_reasoning_exclude_leaves_the_thinking_out_and_the_summary_counts_each(thinking_runs):
    (train, _, train_ids, train_freq), (summary, trained, ids, freq) = thinking_runs["train"], thinking_runs["exclude"]
    assert summary["reasoning"] == "exclude"
    assert trained["field"] == "\n\nParis.<|im_end|>\n\nRome.<|im_end|>"  # what follows </think>: the answer
    assert trained["inline"] == "\n\nThe sea is wide and blue.<|im_end|>"
    assert trained["plain"] == "Hi.<|im_end|>"
    assert ids == train_ids  # the same tokens; only the mask differs
    for s in (train, summary):  # counted alike under both settings
        assert s["reasoning_tokens"] == train["reasoning_tokens"] > 0 and s["rows_with_reasoning"] == 2
        assert s["answer_tokens"] == train["answer_tokens"]
    assert train["trainable_tokens"] == train["reasoning_tokens"] + train["answer_tokens"]
    assert summary["trainable_tokens"] == train["answer_tokens"]
    assert sum(freq.values()) == summary["trainable_tokens"] < sum(train_freq.values())  # the vocab follows the mask


def test_a_pre_filled_think_block_is_thinking_from_the_answers_first_token(chatml):
    """A template whose generation prompt opens <think> (DeepSeek-R1's): the answer's tokens up
    to </think> are the thinking."""
    from draftline.stages.tokenize import apply_reasoning

    tokenizer, stop = chatml
    prefill = CHATML_PREFILL_TEMPLATE
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Greet back.\n</think>\n\nHello!"}]
    tok = tokenize_conversation(tokenizer, messages, stop, chat_template=prefill)
    thinking = tokenizer.decode([t for t, r in zip(tok.input_ids, tok.reasoning) if r])
    assert thinking == "Greet back.\n</think>"
    kept = apply_reasoning(tok, "exclude")
    assert tokenizer.decode([t for t, m in zip(kept.input_ids, kept.loss_mask) if m]) == "\n\nHello!<|im_end|>"


CHATML_PREFILL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{{ '<think>\\n' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
