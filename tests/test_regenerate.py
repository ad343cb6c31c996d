"""Regeneration end to end with real vLLM CPU on the tiny model (one engine for the module, and
one split over two tensor-parallel ranks)."""

import json
import logging
from dataclasses import replace

import pytest

from draftline.runtime.shards import ShardJob
from draftline.runtime.vllm_engine import shutdown, target_llm
from draftline.stages.regenerate import (
    RegenerateSettings,
    merge_shards,
    parse_conversation,
    regenerate,
    regenerate_shard,
    write_answer_settings,
)

SETTINGS = RegenerateSettings(max_new_tokens=6, max_model_len=160, enforce_eager=True, threads=1)

ROWS = [
    {
        "id": "multi",
        "source": "set-a",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "DATASET ANSWER ONE"},
            {"role": "user", "content": "And of Italy?"},
            {"role": "assistant", "content": "DATASET ANSWER TWO"},
        ],
    },
    {"id": "single", "source": "set-b", "messages": [{"role": "user", "content": "Explain how a hash table works."}]},
    {
        "id": "trailing-user",
        "source": "set-b",
        "messages": [
            {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "DATASET ANSWER THREE"},
            {"role": "user", "content": "Write a short poem about the sea."},
        ],
    },
    # first prompt alone overflows max_model_len: left out and counted
    {"id": "too-long", "source": "set-b", "messages": [{"role": "user", "content": "apples, pears, plums; " * 80}]},
    # second prompt overflows: kept with its first answer only, counted
    {
        "id": "shortened",
        "source": "set-c",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "DATASET ANSWER FOUR"},
            {"role": "user", "content": "apples, pears, plums; " * 80},
        ],
    },
]
# which conversations each LLM.chat call answers, in order
BATCHES = [["multi", "single", "trailing-user", "shortened"], ["multi", "trailing-user"]]


class RecordingLLM:
    """The real engine, with every chat() call's prompts and outputs kept for the assertions."""

    def __init__(self, llm):
        self.llm, self.calls = llm, []

    def get_tokenizer(self):
        return self.llm.get_tokenizer()

    def get_metrics(self):
        return self.llm.get_metrics()

    def chat(self, prompts, params, **kwargs):
        outputs = self.llm.chat(prompts, params, **kwargs)
        self.calls.append((prompts, outputs))
        return outputs


@pytest.fixture(scope="module")
def llm(tiny_model):
    # stats on: evaluation's timed_generate reads vLLM's counters (one test calls it here)
    engine = target_llm(tiny_model, SETTINGS, disable_log_stats=False)
    yield engine
    del engine


@pytest.fixture(scope="module")
def run(llm, tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("regen")
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    recorder = RecordingLLM(llm)
    summary = regenerate(
        tiny_model, folder / "prompts.jsonl", folder / "conversations.jsonl", folder / "summary.json", SETTINGS, llm=recorder
    )
    rows = [json.loads(line) for line in (folder / "conversations.jsonl").read_text().splitlines()]
    return rows, summary, recorder.calls, folder


@pytest.mark.dag
def test_rows_keep_ids_and_answers_replace_the_datasets(run):
    rows, summary, _, _ = run
    assert [r["id"] for r in rows] == ["multi", "single", "trailing-user", "shortened"]
    assert [r["source"] for r in rows] == ["set-a", "set-b", "set-b", "set-c"]
    for row, original in zip(rows[:3], ROWS):
        roles = [m["role"] for m in row["messages"]]
        users = [m["content"] for m in original["messages"] if m["role"] == "user"]
        assert [m["content"] for m in row["messages"] if m["role"] == "user"] == users
        assert roles[-1] == "assistant" and roles.count("assistant") == len(users)  # trailing user answered
    assert not any(m["content"].startswith("DATASET ANSWER") for r in rows for m in r["messages"])
    assert [m["role"] for m in rows[3]["messages"]] == ["user", "assistant"]
    assert summary["rows_in"] == 5 and summary["rows_out"] == 4
    assert summary["rows_skipped_prompt_too_long"] == 1 and summary["rows_shortened_prompt_too_long"] == 1
    assert summary["turns_generated"] == 6


@pytest.mark.dag
def test_turns_are_batched_and_later_turns_see_the_targets_own_answers(run):
    rows, _, calls, _ = run
    assert [len(prompts) for prompts, _ in calls] == [len(b) for b in BATCHES]
    by_id = {r["id"]: r["messages"] for r in rows}
    second_turn = dict(zip(BATCHES[1], calls[1][0]))
    assert second_turn["multi"][0]["role"] == "system"
    # the target's own first answer (as written to the output), not the dataset's
    assert second_turn["multi"][2] == {"role": "assistant", "content": by_id["multi"][2]["content"]}
    assert second_turn["trailing-user"][1] == {"role": "assistant", "content": by_id["trailing-user"][1]["content"]}
    assert calls[0][1][0].outputs[0].text == by_id["multi"][2]["content"] != "DATASET ANSWER ONE"


@pytest.mark.dag
def test_answers_and_truncated_flag_follow_vllm_outputs(run):
    rows, summary, calls, _ = run
    by_id = {r["id"]: [m for m in r["messages"] if m["role"] == "assistant"] for r in rows}
    truncated = 0
    for turn, (ids, (_, outputs)) in enumerate(zip(BATCHES, calls)):
        for rid, output in zip(ids, outputs, strict=True):
            answer, completion = by_id[rid][turn], output.outputs[0]
            assert answer["content"] == completion.text
            assert answer.get("truncated", False) == (completion.finish_reason == "length")
            assert "truncated" not in answer or answer["truncated"] is True
            truncated += completion.finish_reason == "length"
    # a random tiny model almost never stops within 6 tokens, so the flag is exercised
    assert truncated == summary["answers_truncated"] >= 1


@pytest.mark.dag
def test_summary_file_matches(run):
    _, summary, _, folder = run
    assert json.loads((folder / "summary.json").read_text()) == summary
    assert summary["generated_tokens"] > 0


# target.tensor_parallel_size 2: two vLLM CPU workers, one core each
SPLIT = replace(SETTINGS, tensor_parallel_size=2, threads=2)


@pytest.fixture(scope="module")
def split_llm(tiny_model):
    engine = target_llm(tiny_model, SPLIT)
    yield engine
    shutdown(engine)


@pytest.mark.dag
def test_tensor_parallel_answers_are_token_identical(run, llm, split_llm, tiny_model, tmp_path):
    _, _, _, folder = run
    regenerate(tiny_model, folder / "prompts.jsonl", tmp_path / "split.jsonl", tmp_path / "split.json", SPLIT, llm=split_llm)
    assert (tmp_path / "split.jsonl").read_bytes() == (folder / "conversations.jsonl").read_bytes()
    assert json.loads((tmp_path / "split.json").read_text())["settings"]["tensor_parallel_size"] == 2
    # Greedy answers of the random tiny target repeat one token; seeded sampling reaches many
    # more, and must pick the same ones from the split logits.
    sampled = {}
    for name, engine in (("whole", llm), ("split", split_llm)):
        settings = replace(SPLIT if name == "split" else SETTINGS, temperature=1.0, max_new_tokens=12)
        regenerate(tiny_model, folder / "prompts.jsonl", tmp_path / f"{name}.jsonl", tmp_path / f"{name}.json", settings, llm=engine)
        sampled[name] = (tmp_path / f"{name}.jsonl").read_text()
    assert sampled["split"] == sampled["whole"] != (folder / "conversations.jsonl").read_text()


# ---------------------------------------------------------------- shards, staging, merge

# the rows above (one left out, one shortened) and single-turn ones: 12 conversations
SHARD_ROWS = ROWS + [
    {"id": f"q{i}", "source": "set-d", "messages": [{"role": "user", "content": q}]}
    for i, q in enumerate(["Name a planet.", "Count to three.", "What is rain?", "Say hi.", "Why is ice cold?",
                           "Spell cat.", "What is a tree?"])
]


def write_prompts(folder, rows=SHARD_ROWS):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_answer_settings(folder / "prompts.jsonl", folder / "settings.json", {"max_new_tokens": SETTINGS.max_new_tokens})
    return folder / "prompts.jsonl", folder / "settings.json"


def sharded_run(llm, tiny_model, folder, num_shards, settings):
    """Every shard of `num_shards` with `llm`, then the merge; returns the shard summaries."""
    prompts, answer_settings = write_prompts(folder)
    shards = [folder / f"shard_{k}" for k in range(num_shards)]
    summaries = [
        regenerate_shard(tiny_model, prompts, answer_settings, ShardJob(k, num_shards, shards[k]), settings, llm=llm)
        for k in range(num_shards)
    ]
    merge_shards(shards, answer_settings, folder / "conversations.jsonl", folder / "summary.json")
    return summaries


@pytest.mark.dag
def test_shards_merge_to_the_unsharded_file_byte_for_byte_with_readable_progress(llm, tiny_model, tmp_path, caplog):
    prompts, _ = write_prompts(tmp_path / "one")
    unsharded = regenerate(tiny_model, prompts, tmp_path / "one.jsonl", tmp_path / "one.json", SETTINGS, llm=llm)
    with caplog.at_level(logging.INFO, logger="draftline.stages.regenerate"):
        # 3 shards of 4 conversations, 3 at a time: chunks and shards cut across one another
        shards = sharded_run(llm, tiny_model, tmp_path / "three", 3, replace(SETTINGS, chunk_conversations=3))
    merged = tmp_path / "three" / "conversations.jsonl"
    assert merged.read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    summary = json.loads((tmp_path / "three" / "summary.json").read_text())
    counters = ("rows_in", "rows_out", "turns_generated", "answers_truncated", "generated_tokens", "prompt_tokens",
                "rows_skipped_prompt_too_long", "rows_shortened_prompt_too_long")
    assert {k: summary[k] for k in counters} == {k: unsharded[k] for k in counters}
    assert [(s["row_start"], s["row_stop"], s["answered"], s["reused"]) for s in shards] == [
        (0, 4, 4, 0), (4, 8, 4, 0), (8, 12, 4, 0)]
    # progress a person can read: done/total, speed, time left, truncations so far
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress:")]
    assert len(progress) == 6  # two chunks (3 + 1 conversations) per shard
    assert progress[1].startswith("progress: 4/4 conversations (100.0%), ")
    assert " tok/s, about 0:00:00 left, " in progress[1] and " answers truncated so far" in progress[1]


@pytest.mark.dag
def test_a_crashed_shard_resumes_from_checked_chunks_answering_only_the_rest(llm, tiny_model, tmp_path):
    """A shard that stopped after its first chunk: the rerun answers only the other
    conversations (requests counted), discards a chunk whose file changed and the staging of
    other settings, and publishes what an uninterrupted run does."""
    folder, settings = tmp_path / "run", replace(SETTINGS, chunk_conversations=4)
    sharded_run(llm, tiny_model, tmp_path / "reference", 1, settings)
    prompts, answer_settings = write_prompts(folder)
    crashing = RecordingLLM(llm)
    chat = crashing.chat

    def crash_on_the_second_chunk(prompts_, params, **kwargs):
        if len(crashing.calls) == 2:  # chunk 1 took two calls (its multi-turn conversation)
            raise RuntimeError("killed")
        return chat(prompts_, params, **kwargs)

    crashing.chat = crash_on_the_second_chunk
    with pytest.raises(RuntimeError, match="killed"):
        regenerate_shard(tiny_model, prompts, answer_settings, ShardJob(0, 1, folder / "shard_0"), settings, llm=crashing)
    staging = folder / ".staging"
    [key] = [d.name for d in staging.iterdir()]
    assert sorted(p.name for p in (staging / key).iterdir()) == ["chunk_0-4.json", "chunk_0-4.jsonl"]
    (staging / "0123456789abcdef").mkdir()  # staged with other settings: removed

    rerun = RecordingLLM(llm)
    summary = regenerate_shard(tiny_model, prompts, answer_settings, ShardJob(0, 1, folder / "shard_0"), settings, llm=rerun)
    asked = [p[-1]["content"] for prompts_, _ in rerun.calls for p in prompts_]
    assert len(asked) == len(set(asked))
    first_users = {p[0]["content"] if p[0]["role"] == "user" else p[1]["content"] for prompts_, _ in rerun.calls for p in prompts_}
    assert first_users == {r["messages"][0]["content"] for r in SHARD_ROWS[4:]}  # not the first chunk's again
    assert (summary["answered"], summary["reused"]) == (8, 4)
    assert [d.name for d in staging.iterdir()] == [key]
    reference = (tmp_path / "reference" / "shard_0" / "conversations.jsonl").read_bytes()
    assert (folder / "shard_0" / "conversations.jsonl").read_bytes() == reference

    # a staged rows file changed after staging: that chunk is answered again, nothing else
    rows_file = staging / key / "chunk_4-8.jsonl"
    rows_file.write_text(rows_file.read_text().replace('"assistant"', '"assistant" ', 1))
    again = RecordingLLM(llm)
    summary = regenerate_shard(tiny_model, prompts, answer_settings, ShardJob(0, 1, folder / "shard_0"), settings, llm=again)
    assert (summary["answered"], summary["reused"]) == (4, 8)
    assert (folder / "shard_0" / "conversations.jsonl").read_bytes() == reference


@pytest.mark.dag
def test_merge_refuses_shards_that_do_not_tile_the_prompts(llm, tiny_model, tmp_path):
    folder = tmp_path / "run"
    sharded_run(llm, tiny_model, folder, 2, SETTINGS)
    with pytest.raises(ValueError, match=r"shard_1: shard 1 of 2 from row 6, expected shard 0 of 1 from row 0"):
        merge_shards([folder / "shard_1"], folder / "settings.json", tmp_path / "c.jsonl", tmp_path / "s.json")
    other = write_answer_settings(folder / "prompts.jsonl", tmp_path / "other.json", {"max_new_tokens": 7})
    with pytest.raises(ValueError, match=rf"shard_0: answered with key \w+, .*other.json has {other['key']}"):
        merge_shards([folder / "shard_0", folder / "shard_1"], tmp_path / "other.json", tmp_path / "c.jsonl", tmp_path / "s.json")


def test_bad_row_names_file_line_and_id():
    with pytest.raises(ValueError, match=r"f.jsonl:3 \(id 'x'\): messages\[1\] has role 'user'"):
        parse_conversation({"id": "x", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "f.jsonl:3")


def test_chat_template_kwargs_reach_vllm_chat_in_regeneration_and_evaluation(llm, tiny_model, tmp_path):
    """target.chat_template_kwargs go to vLLM's LLM.chat as the template's variables: the prompts
    vLLM rendered (its own prompt token ids) open the answer with a Qwen3-style empty think block."""
    from draftline.stages.evaluate import EvaluateSettings, Prompt, timed_generate
    from draftline.testing.tiny_model import CHATML_THINKING_TEMPLATE, NO_THINK

    template = tmp_path / "thinking.jinja"
    template.write_text(CHATML_THINKING_TEMPLATE)
    kwargs = {"enable_thinking": False}
    tokenizer = llm.get_tokenizer()
    (tmp_path / "prompts.jsonl").write_text(json.dumps(ROWS[0]) + "\n")  # two user turns
    recorder = RecordingLLM(llm)
    regenerate(tiny_model, tmp_path / "prompts.jsonl", tmp_path / "out.jsonl", tmp_path / "summary.json",
               replace(SETTINGS, chat_template=str(template), chat_template_kwargs=kwargs), llm=recorder)
    rendered = [tokenizer.decode(o.prompt_token_ids) for _, outputs in recorder.calls for o in outputs]
    assert len(rendered) == 2  # one call per turn
    for text in rendered:
        assert text.endswith("<|im_start|>assistant\n" + NO_THINK)
    assert rendered[1].count(NO_THINK) == 2  # the earlier answer in the history too

    # evaluation's call (the same LLM.chat with the settings' kwargs), with and without them
    prompt = Prompt("p", [{"role": "user", "content": "Name a color."}])
    for settings, think in ((EvaluateSettings(max_new_tokens=2, chat_template_kwargs=kwargs), True),
                            (EvaluateSettings(max_new_tokens=2), False)):
        recorder = RecordingLLM(llm)
        timed_generate(recorder, [prompt], settings, CHATML_THINKING_TEMPLATE)
        (_, outputs), = recorder.calls
        assert tokenizer.decode(outputs[0].prompt_token_ids).endswith(NO_THINK) == think


@pytest.mark.slow
def test_embedded_target_trained_tokens_are_exactly_what_it_generated(embedded_target, tmp_path_factory):
    """SmolLM2 (ChatML, no generation tags): regenerate, tokenize, and the loss mask covers the
    target's own answer tokens, stop token included for complete answers, nothing else."""
    from datasets import load_from_disk

    from draftline.stages.tokenize import TokenizeSettings, tokenize

    folder, target = tmp_path_factory.mktemp("embedded"), embedded_target
    prompts = folder / "prompts.jsonl"
    rows = [{"id": f"q{i}", "source": "t", "messages": [{"role": "user", "content": q}]} for i, q in enumerate(
        ["What is the capital of France?", "Write a haiku about rain.", "Who wrote Hamlet?", "What is recursion?"]
    )]
    rows.append(ROWS[0])  # multi-turn with a system prompt
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = RegenerateSettings(max_new_tokens=24, max_model_len=512, threads=1)
    recorder = RecordingLLM(target_llm(target, settings))
    regenerate(target, prompts, folder / "conv.jsonl", folder / "regen.json", settings, llm=recorder)
    summary = tokenize(target, folder / "conv.jsonl", folder / "ds", folder / "freq.pt", folder / "tok.json",
                       TokenizeSettings(max_seq_len=512))

    generated = {}  # id -> the target's token ids, turn after turn
    batches = [[r["id"] for r in rows], [rows[-1]["id"]]]
    for ids, (_, outputs) in zip(batches, recorder.calls, strict=True):
        for rid, output in zip(ids, outputs, strict=True):
            generated.setdefault(rid, []).extend(output.outputs[0].token_ids)
    dataset = load_from_disk(str(folder / "ds")).with_format(None)
    assert summary["ids"] == [r["id"] for r in rows]
    assert summary["answers_truncated_at_generation"] >= 1  # both kinds of answer are covered
    for rid, ids, mask in zip(summary["ids"], dataset["input_ids"], dataset["loss_mask"]):
        assert [t for t, m in zip(ids, mask) if m] == generated[rid], rid


def test_the_answers_digest_is_the_merged_files_sha256_in_sha256sums_format(tmp_path):
    """results/regenerated/conversations.sha256, what tokenize follows: `sha256sum -c` checks it
    from its folder, and only the conversations' content changes it."""
    import subprocess

    from draftline.stages.regenerate import write_answers_digest

    merged, digest = tmp_path / "conversations.jsonl", tmp_path / "conversations.sha256"
    merged.write_text('{"id": "a", "messages": []}\n')
    first = write_answers_digest(merged, digest)
    assert digest.read_text() == f"{first}  conversations.jsonl\n"
    assert subprocess.run(["sha256sum", "-c", digest.name], cwd=tmp_path, capture_output=True).returncode == 0
    merged.write_text('{"id": "a", "messages": []}\n')  # rewritten, same content
    assert write_answers_digest(merged, digest) == first
    merged.write_text('{"id": "a", "messages": [{"role": "assistant", "content": "other"}]}\n')
    assert write_answers_digest(merged, digest) != first


# ------------------------------------------------------------------- tool calls and thinking


class ScriptedLLM:
    """vLLM's `LLM.chat` as regeneration calls it: each prompt rendered with the target's
    tokenizer as vLLM renders it (tools included), answered by `reply(messages)`."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.calls = tokenizer, reply, []

    def get_tokenizer(self):
        return self.tokenizer

    def chat(self, prompts, params, use_tqdm=None, chat_template=None, chat_template_kwargs=None, tools=None):
        from types import SimpleNamespace

        outputs, texts = [], []
        for messages in prompts:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=chat_template, tokenize=False,
                                                      add_generation_prompt=True, **(chat_template_kwargs or {}))
            answer = self.reply(messages)
            completion = SimpleNamespace(text=answer, token_ids=self.tokenizer(answer, add_special_tokens=False)["input_ids"],
                                         finish_reason="stop")
            outputs.append(SimpleNamespace(prompt_token_ids=self.tokenizer(text, add_special_tokens=False)["input_ids"],
                                           outputs=[completion]))
            texts.append(text)
        self.calls.append({"tools": tools, "texts": texts, "seeds": [p.seed for p in params]})
        return outputs


def _call(name, **arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


THINKING = "<think>\nI need the weather.\n</think>\n\n"
SCRIPT = {  # the last message's content -> the target's reply
    "What is the weather in Paris?": THINKING + _call("get_weather", city="Paris"),
    '{"temperature": 21, "sky": "clear"}': "It is 21 degrees.",
    "Weather in Rome and in Oslo?": _call("get_weather", city="Rome") + "\n" + _call("get_weather", city="Oslo"),
    '{"temperature": 4}': "Rome is warmer today.",
    "Thanks! Which is warmer?": "Rome.",
    "What is 2 + 2?": _call("get_weather", city="Two"),  # another function than the data's result answers
    "Add 3 and 4, please.": "<think>\nA small sum.\n</think>\n\n7.",
}


@pytest.fixture(scope="module")
def tool_run(tiny_model, tmp_path_factory):
    """The tool-call fixture through the prompts stage and a regeneration whose target thinks
    and calls tools (scripted), with the tiny model's tokenizer and a template that renders both."""
    from pathlib import Path

    from draftline.stages.prompts import PromptsSettings, collect_prompts
    from draftline.stages.tokenize import load_tokenizer
    from draftline.testing.tiny_model import CHATML_AGENT_TEMPLATE

    folder = tmp_path_factory.mktemp("tools")
    fixture = Path(__file__).parent / "data" / "prompts" / "tool_calls.jsonl"
    rows = list(collect_prompts([str(fixture)], PromptsSettings(validation=0, test=0)).train)
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "template.jinja").write_text(CHATML_AGENT_TEMPLATE)
    settings = replace(SETTINGS, max_model_len=1024, max_new_tokens=64, chat_template=str(folder / "template.jinja"))
    llm = ScriptedLLM(load_tokenizer(tiny_model), lambda messages: SCRIPT[messages[-1]["content"]])
    summary = regenerate(tiny_model, folder / "prompts.jsonl", folder / "out.jsonl", folder / "summary.json", settings, llm=llm)
    out = {r["messages"][1 if r["messages"][0]["role"] == "system" else 0]["content"]: r
           for r in map(json.loads, (folder / "out.jsonl").read_text().splitlines())}
    return out, summary, llm.calls, folder, settings


def test_regeneration_renders_the_tools_and_splices_the_datas_results_after_the_targets_own_calls(tool_run):
    out, summary, calls, _, _ = tool_run
    paris = out["What is the weather in Paris?"]["messages"]
    assert [m["role"] for m in paris] == ["system", "user", "assistant", "tool", "assistant"]
    assert paris[2] == {"role": "assistant", "content": THINKING, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert paris[3] == {"role": "tool", "content": '{"temperature": 21, "sky": "clear"}', "tool_call_id": "call_1"}
    assert paris[4] == {"role": "assistant", "content": "It is 21 degrees."}  # the dataset's answer is gone
    two = out["Weather in Rome and in Oslo?"]["messages"]  # parallel calls, then a second user turn
    assert [m["role"] for m in two] == ["user", "assistant", "tool", "tool", "assistant", "user", "assistant"]
    assert [c["id"] for c in two[1]["tool_calls"]] == ["r", "o"]
    assert [m["content"] for m in two[4:]] == ["Rome is warmer today.", "Thanks! Which is warmer?", "Rome."]
    # a call for another function than the data's result answers: the conversation ends at it
    add = out["What is 2 + 2?"]["messages"]
    assert [m["role"] for m in add] == ["user", "assistant"] and add[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert summary["tool_calls_generated"] == 4 and summary["tool_results_spliced"] == 3
    assert summary["rows_shortened_tool_results"] == 1 and summary["rows_out"] == 4
    # every prompt of a chat call had that call's tools rendered into it, and only those
    for call in calls:
        names = {t["function"]["name"] for t in call["tools"]}
        for text in call["texts"]:
            assert "<tools>" in text and all(f'"name": "{n}"' in text for n in names)
    after_call = [t for c in calls for t in c["texts"] if t.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")]
    assert any('{"temperature": 21, "sky": "clear"}' in t and "I need the weather." in t for t in after_call)
    seeds = [s for c in calls for s in c["seeds"]]
    assert len(seeds) == len(set(seeds)) == summary["turns_generated"]


def test_regeneration_keeps_the_thinking_the_target_generates(tool_run):
    out, _, _, _, _ = tool_run
    answer = out["Add 3 and 4, please."]["messages"][-1]
    assert answer == {"role": "assistant", "content": "<think>\nA small sum.\n</think>\n\n7."}


def test_regenerated_tool_conversations_train_the_targets_calls_and_answers_never_the_results(tool_run, tiny_model):
    """Through tokenization: the trained tokens are the target's replies (thinking and call text
    included) with their end-of-turn tokens; the tool results, the tools and the prompts are not."""
    from datasets import load_from_disk

    from draftline.stages.tokenize import TokenizeSettings, load_tokenizer, tokenize

    out, _, _, folder, settings = tool_run
    summary = tokenize(tiny_model, folder / "out.jsonl", folder / "ds", folder / "freq.pt", folder / "tok.json",
                       TokenizeSettings(max_seq_len=1024, chat_template=settings.chat_template))
    tokenizer = load_tokenizer(tiny_model)
    dataset = load_from_disk(str(folder / "ds")).with_format(None)
    trained = {rid: tokenizer.decode([t for t, m in zip(ids, mask) if m])
               for rid, ids, mask in zip(summary["ids"], dataset["input_ids"], dataset["loss_mask"])}
    paris = trained[out["What is the weather in Paris?"]["id"]]
    assert paris == (THINKING + _call("get_weather", city="Paris") + "<|im_end|>" + "It is 21 degrees.<|im_end|>")
    for text in trained.values():
        assert "temperature" not in text and "<tools>" not in text and "<tool_response>" not in text
    assert summary["reasoning_tokens"] > 0 and summary["rows_with_reasoning"] == 2


@pytest.mark.dag
def test_vllm_renders_tools_calls_results_and_thinking_as_tokenization_does(tiny_model):
    """The real engine: `LLM.chat` given a row's tools and a history holding a call with its
    thinking and the tool's result renders the prompt token for token as tokenization's
    `apply_chat_template` does, so the regenerated answers and their loss masks agree."""
    from pathlib import Path

    from draftline.artifacts.conversations import template_messages
    from draftline.sources import normalize_conversation
    from draftline.testing.tiny_model import CHATML_AGENT_TEMPLATE

    row = json.loads((Path(__file__).parent / "data" / "prompts" / "tool_calls.jsonl").read_text().splitlines()[0])
    conversation = normalize_conversation(row, regenerate_enabled=True)
    history = template_messages(conversation.messages[:4])  # system, user, the call (thinking), its result
    tools = conversation.tools
    llm = target_llm(tiny_model, replace(SETTINGS, max_model_len=1024))  # the module's engine holds 160 tokens
    try:
        (output,) = llm.chat([history], None, use_tqdm=False, chat_template=CHATML_AGENT_TEMPLATE, tools=tools)
        tokenizer = llm.get_tokenizer()
    finally:
        shutdown(llm)
    text = tokenizer.apply_chat_template(history, tools=tools, chat_template=CHATML_AGENT_TEMPLATE,
                                         tokenize=False, add_generation_prompt=True)
    assert "<tools>" in text and "I should call the weather tool." in text and "<tool_response>" in text
    assert list(output.prompt_token_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
