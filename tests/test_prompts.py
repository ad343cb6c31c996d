"""The prompts stage: every source format, stable ids, de-duplication, bad rows, the split."""

import json
import re
from pathlib import Path

import pytest

from draftline.sources import PromptError, check_sources, source_files
from draftline.stages.prompts import PromptFiles, PromptsSettings, build_prompts, collect_prompts


def collect(sources, **settings):
    """collect_prompts with nothing held out unless asked (the schema holds out 50 + 50)."""
    return collect_prompts(sources, PromptsSettings(**{"validation": 0, "test": 0, **settings}))

DATA = Path(__file__).parent / "data" / "prompts"
MESSAGES, SHAREGPT, PROMPT, ROWS_JSON = (
    str(DATA / name) for name in ("messages.jsonl", "sharegpt.jsonl", "prompt.jsonl", "rows.json")
)
SAME = [{"role": "user", "content": "Name a prime number."}, {"role": "assistant", "content": "7"}]


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def build(tmp_path, sources, **settings):
    out = tmp_path / "out"
    files = PromptFiles(out / "prompts.jsonl", out / "validation.jsonl", out / "test.jsonl", out / "rejects.jsonl",
                        out / "summary.json")
    summary = build_prompts([str(s) for s in sources], files, PromptsSettings(**{"validation": 0, "test": 0, **settings}))
    assert json.loads((out / "summary.json").read_text()) == summary
    return (
        read_jsonl(out / "prompts.jsonl"),
        read_jsonl(out / "validation.jsonl") + read_jsonl(out / "test.jsonl"),
        read_jsonl(out / "rejects.jsonl"),
        summary,
    )


def write(tmp_path, text, name="src.jsonl"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


def jsonl(*rows):
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def by_source(rows, source):
    return [r for r in rows if r["source"] == source]


# ------------------------------------------------------------------------------------ formats


def test_every_format_normalized_with_system_multiturn_and_unicode(tmp_path):
    train, held, rejects, summary = build(tmp_path, [MESSAGES, SHAREGPT, PROMPT, ROWS_JSON])
    rows = {r["id"]: r for r in train + held}
    assert rejects == []
    for row in rows.values():
        assert set(row) == {"id", "source", "messages"}
        assert all(set(m) == {"role", "content"} for m in row["messages"])
    contents = {r["messages"][-1]["content"]: r for r in rows.values()}
    # multi-turn with unicode (kept as is, not escaped)
    assert [m["role"] for m in contents["Γειά σου"]["messages"]] == ["user", "assistant"] * 2
    assert contents["Γειά σου"]["messages"][1]["content"] == "こんにちは 👋"
    assert "こんにちは 👋" in "".join(
        (tmp_path / "out" / name).read_text(encoding="utf-8") for name in ("prompts.jsonl", "validation.jsonl", "test.jsonl")
    )
    # ShareGPT system/human/gpt -> system/user/assistant
    assert contents["Bonjour ! Ça va ?"]["messages"] == [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "Bonjour ! Ça va ?"},
    ]
    # plain prompt with system; prompt with completion, from a .json list
    assert contents["Translate 'thank you' to German."]["messages"] == [
        {"role": "system", "content": "You are a translator."},
        {"role": "user", "content": "Translate 'thank you' to German."},
    ]
    assert contents["n-a-ï-v-e"]["source"] == ROWS_JSON
    formats = {s["path"]: s["format"] for s in summary["sources"]}
    assert formats == {MESSAGES: "jsonl", SHAREGPT: "jsonl", PROMPT: "jsonl", ROWS_JSON: "json"}
    # 3 + 3 + 3 + 2 rows, the prime-number conversation in three of them
    assert summary["totals"]["rows_read"] == 11
    assert summary["totals"]["duplicates"] == 2
    assert len(rows) == summary["totals"]["kept"] == 9


def test_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    datasets.Dataset.from_list(
        [
            {"conversations": [{"from": "human", "value": "Hi ☃"}, {"from": "gpt", "value": "Hello ☃"}]},
            {"conversations": [{"from": "human", "value": "Name a prime number."}, {"from": "gpt", "value": "7"}]},
        ]
    ).save_to_disk(str(folder))
    train, held, _, summary = build(tmp_path, [folder, MESSAGES], regenerate_enabled=False)
    rows = train + held
    assert summary["sources"][0]["format"] == "dataset"
    assert summary["sources"][0]["kept"] == 2
    assert [m["content"] for m in by_source(rows, str(folder))[0]["messages"]] in (
        ["Hi ☃", "Hello ☃"],
        ["Name a prime number.", "7"],
    )
    # the dataset came first, so it keeps the shared conversation
    assert summary["sources"][1]["duplicates"] == 1
    assert str(folder / "state.json") in source_files([str(folder)])


def test_dataset_dict_folder_names_the_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "x"}])}).save_to_disk(str(folder))
    with pytest.raises(PromptError, match=r"dd/train"):
        collect([str(folder)])
    assert collect([str(folder / "train")]).summary["totals"]["kept"] == 1


def test_bad_row_in_dataset_names_the_row_index(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    datasets.Dataset.from_list([{"prompt": "fine"}, {"prompt": ""}]).save_to_disk(str(folder))
    with pytest.raises(PromptError, match=r"ds\[1\]: `prompt` has empty content"):
        collect([str(folder)])


def test_parquet_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "chats.parquet"
    datasets.Dataset.from_list([
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ☃"},
                      {"role": "assistant", "content": "Hello ☃"}]},
        {"messages": SAME},
    ]).to_parquet(str(path))
    train, held, _, summary = build(tmp_path, [path, MESSAGES], regenerate_enabled=False)
    assert summary["sources"][0]["format"] == "parquet" and summary["sources"][0]["kept"] == 2
    assert sorted(r["messages"][0]["content"] for r in by_source(train + held, str(path))) == ["Be brief.", SAME[0]["content"]]
    assert summary["sources"][1]["duplicates"] == 1  # the same conversation as in the JSONL, the same id


def test_bad_parquet_row_names_file_row_and_key(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "chats.parquet"
    datasets.Dataset.from_list([{"messages": SAME}, {"messages": [{"role": "robot", "content": "beep"}]}]).to_parquet(str(path))
    with pytest.raises(PromptError, match=r"chats\.parquet\[1\]: messages\[0\] has unknown role 'robot' \(fix: use system"):
        collect([str(path)])
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(PromptError, match=r"broken\.parquet: cannot be read as Parquet .*fix: rewrite it"):
        collect([str(tmp_path / "broken.parquet")])


def cache_hub_dataset(cache: Path, repo_id: str, rows: list[dict], split: str = "train") -> None:
    """What `datasets.load_dataset(repo_id)` leaves in HF_DATASETS_CACHE once it has downloaded
    it: <org>___<name>/default/0.0.0/<hash>/<name>-<split>.arrow with dataset_info.json, built
    here by datasets' own json builder from a local file (no network)."""
    import shutil

    from datasets.packaged_modules.json.json import Json

    org, name = repo_id.split("/")
    source = cache.parent / f"{name}-{split}.jsonl"
    source.write_text(jsonl(*rows))
    builder = Json(cache_dir=str(cache.parent / "build"), dataset_name=name, config_name="default",
                   hash="0123456789abcdef", data_files={split: str(source)})
    builder.download_and_prepare()
    built = Path(builder.cache_dir)
    target = cache / f"{org}___{name}" / "default" / "0.0.0" / built.name
    shutil.copytree(built, target)
    info = json.loads((target / "dataset_info.json").read_text())
    (target / "dataset_info.json").write_text(json.dumps({**info, "config_name": "default"}))


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """An empty HF_DATASETS_CACHE that datasets reads; the network is off."""
    from datasets import config

    cache = tmp_path / "hf" / "datasets"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(config, "HF_DATASETS_CACHE", cache)  # datasets reads it once, at import
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_hub_dataset_from_the_local_datasets_cache(tmp_path, datasets_cache):
    from datasets import config

    cache_hub_dataset(datasets_cache, "acme/tiny-chats", [
        {"conversations": [{"from": "human", "value": "Hi ☃"}, {"from": "gpt", "value": "Hello ☃"}]},
        {"messages": None, "conversations": [{"from": "human", "value": SAME[0]["content"]}, {"from": "gpt", "value": "7"}]},
    ])
    online = config.HF_HUB_OFFLINE
    check_sources(["hf:acme/tiny-chats"])
    train, held, _, summary = build(tmp_path, ["hf:acme/tiny-chats", MESSAGES], regenerate_enabled=False)
    assert summary["sources"][0]["format"] == "hub" and summary["sources"][0]["kept"] == 2
    assert summary["sources"][1]["duplicates"] == 1
    assert config.HF_HUB_OFFLINE == online  # read offline, the setting given back
    # the cached files are the rule's inputs: a new download of the dataset reruns the prompts
    assert any(f.endswith("tiny-chats-train.arrow") for f in source_files(["hf:acme/tiny-chats"]))


def test_hub_dataset_errors_name_the_source_and_the_fix(tmp_path, datasets_cache):
    with pytest.raises(PromptError, match=r"hf:acme/absent: acme/absent is not in the local datasets cache .*"
                                          r"datasets.load_dataset\('acme/absent', split='train'\)"):
        check_sources(["hf:acme/absent"])
    with pytest.raises(PromptError, match=r"hf:acme: not a hub dataset source \(fix: write hf:ORG/NAME"):
        check_sources(["hf:acme"])
    cache_hub_dataset(datasets_cache, "acme/tiny-chats", [{"prompt": "fine"}, {"prompt": ""}])
    with pytest.raises(PromptError, match=r"hf:acme/tiny-chats:test: .*split='test'.* failed.*fix: name a cached split"):
        collect(["hf:acme/tiny-chats:test"])
    with pytest.raises(PromptError, match=r"hf:acme/tiny-chats\[1\]: `prompt` has empty content"):
        collect(["hf:acme/tiny-chats"])


def test_every_format_is_counted_for_the_plan_as_the_prompts_job_reads_it(tmp_path, datasets_cache, monkeypatch):
    """The plan's estimates count the sources' rows at parse time without reading them."""
    import datasets

    from draftline import sources

    folder = tmp_path / "ds"
    datasets.Dataset.from_list([{"prompt": f"p{i}"} for i in range(3)]).save_to_disk(str(folder))
    parquet = tmp_path / "chats.parquet"
    datasets.Dataset.from_list([{"prompt": f"q{i}"} for i in range(4)]).to_parquet(str(parquet))
    cache_hub_dataset(datasets_cache, "acme/tiny-chats", [{"prompt": f"h{i}"} for i in range(5)])
    no_final_newline = write(tmp_path, jsonl({"prompt": "a"}, {"prompt": "b"}).rstrip("\n"))
    paths = [no_final_newline, SHAREGPT, ROWS_JSON, str(folder), str(parquet), "hf:acme/tiny-chats"]
    read = [sum(1 for _ in sources.read_source(p)[2]) for p in paths]
    assert [sources.count_rows([p]) for p in paths] == [(n, None) for n in read]
    assert sources.count_rows(paths) == (sum(read), None)
    # a split the cache does not size, a JSON list too large to parse at plan time: why not
    rows, why = sources.count_rows([SHAREGPT, "hf:acme/tiny-chats:test"])
    assert rows is None and why == "hf:acme/tiny-chats:test: no cached dataset_info.json gives the size of split 'test'"
    monkeypatch.setattr(sources.json_files, "COUNT_JSON_LIST_MAX_BYTES", 10)
    rows, why = sources.count_rows([ROWS_JSON])
    assert rows is None and why.startswith(f"{ROWS_JSON}: a JSON list of 0 MiB, counted by the prompts job")


def test_the_plan_of_jsonl_sources_does_not_import_datasets(tmp_path):
    """`datasets` is imported only for a save_to_disk folder or an hf: source: the default
    config's dry run (JSONL prompts) does not pay its import."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from draftline.sources import check_sources, count_rows, read_source, source_files\n"
        f"paths = [{MESSAGES!r}, {ROWS_JSON!r}]\n"
        "check_sources(paths); count_rows(paths); source_files(paths)\n"
        "[list(read_source(p)[2]) for p in paths]\n"
        "print('datasets' in sys.modules)\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": src})
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------------------- ids, dedupe


def test_ids_are_stable_across_runs_and_formats(tmp_path):
    a = write(tmp_path, jsonl({"messages": SAME}), "a.jsonl")
    b = write(tmp_path, jsonl({"conversations": [{"from": "human", "value": "Name a prime number."},
                                                {"from": "gpt", "value": "7"}]}), "b.jsonl")
    c = write(tmp_path, jsonl({"prompt": "Name a prime number.", "response": "7"}), "c.jsonl")
    ids = {collect([p]).train[0]["id"] for p in (a, b, c)}
    assert len(ids) == 1
    assert collect([a]).train[0]["id"] in ids  # a second run: same id
    # a different answer is a different conversation
    d = write(tmp_path, jsonl({"messages": [SAME[0], {"role": "assistant", "content": "11"}]}), "d.jsonl")
    assert collect([d]).train[0]["id"] not in ids


def test_duplicates_removed_across_sources_keeping_the_first(tmp_path):
    first = write(tmp_path, jsonl({"messages": SAME}, {"prompt": "only here"}), "first.jsonl")
    second = write(tmp_path, jsonl({"prompt": "Name a prime number.", "response": "7"},
                                   {"messages": SAME}), "second.jsonl")
    result = collect([first, second])
    assert len(result.train) == 2
    assert {r["source"] for r in result.train if r["messages"] == SAME} == {first}
    s = {src["path"]: src for src in result.summary["sources"]}
    assert (s[first]["kept"], s[first]["duplicates"]) == (2, 0)
    assert (s[second]["kept"], s[second]["duplicates"]) == (0, 2)
    assert result.summary["totals"]["duplicates"] == 2


# ---------------------------------------------------------------------------------- bad input

GOOD = {"messages": SAME}
BAD_ROWS = {
    "unknown_format": ({"text": "hello"}, r"none of the fields messages, conversations, prompt"),
    "empty_conversation": ({"messages": []}, r"`messages` is empty"),
    "unknown_role": ({"messages": [{"role": "bot", "content": "x"}]}, r"unknown role 'bot'"),
    "bad_content": ({"messages": [{"role": "user", "content": 3}]}, r"content is a int, not a string"),
    "empty_content": ({"conversations": [{"from": "human", "value": "  "}]}, r"conversations\[0\] has empty content"),
    "system_not_first": (
        {"messages": [SAME[0], {"role": "system", "content": "late"}, SAME[1]]},
        r"messages\[1\] is a system message",
    ),
    "not_alternating": ({"messages": [SAME[0], SAME[0], SAME[1]]}, r"messages\[1\] is user where assistant"),
    "no_user_turn": (
        {"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]},
        r"no user turn",
    ),
    "not_an_object": ([1, 2], r"the row is a JSON list"),
}


@pytest.mark.parametrize("code", sorted(BAD_ROWS))
def test_bad_row_stops_with_file_line_and_fix(tmp_path, code):
    row, message = BAD_ROWS[code]
    path = write(tmp_path, jsonl(GOOD, {"prompt": "fine"}, row))
    with pytest.raises(PromptError, match=rf"^{path}:3: .*{message}.*\(fix: .+\)$"):
        collect([path])


@pytest.mark.parametrize(
    "content, line, message",
    [
        (jsonl(GOOD) + '{"messages": [}\n' + jsonl(GOOD), 2, r"malformed JSON"),
        (jsonl(GOOD, {"prompt": "x"}) + '{"messages": [{"role": "us', 3, r"the last line is cut off"),
        (jsonl(GOOD).encode() + b'{"prompt": "caf\xe9"}\n', 2, r"bytes that are not UTF-8 \(0xe9"),
    ],
    ids=["malformed", "truncated", "not-utf8"],
)
def test_unreadable_line_stops_with_file_and_line(tmp_path, content, line, message):
    path = write(tmp_path, content)
    with pytest.raises(PromptError, match=rf"^{path}:{line}: {message}.*\(fix: .+\)$"):
        collect([path])


def test_final_assistant_turn_required_only_without_regeneration(tmp_path):
    path = write(tmp_path, jsonl(GOOD, {"messages": [SAME[0], SAME[1], {"role": "user", "content": "more?"}]}))
    with pytest.raises(PromptError, match=rf"{path}:2: .*ends with a user turn.*regenerate.enabled"):
        collect([path], regenerate_enabled=False)
    # with regeneration both endings are fine: the target writes the answers
    assert len(collect([path], regenerate_enabled=True).train) == 2


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_missing_or_empty_source_is_an_error_in_both_modes(tmp_path, mode):
    good = write(tmp_path, jsonl(GOOD), "good.jsonl")
    # check_sources (at parse time) catches each of them too
    for bad, message in [
        (str(tmp_path / "nope.jsonl"), "prompt source not found"),
        (write(tmp_path, "", "empty.jsonl"), "empty file"),
        (write(tmp_path, "\n\n", "blank.jsonl"), "empty file"),
        (write(tmp_path, "[]", "empty.json"), "empty list"),
        (str(tmp_path), "a folder that was not written by datasets.save_to_disk"),
    ]:
        with pytest.raises(PromptError, match=rf"^{bad}: {message}"):
            collect([good, bad], on_bad_row=mode)
        with pytest.raises(PromptError, match=rf"^{bad}: {message}"):
            check_sources([good, bad], regenerate_enabled=True, on_bad_row=mode)


def _in_every_format(tmp_path, rows, datasets_cache):
    """`rows` (all with the same keys) as each kind of source check_sources reads: (source, how
    its row i is named in messages)."""
    import datasets

    tmp_path.mkdir()
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    cache_hub_dataset(datasets_cache, f"acme/{tmp_path.name}", rows)
    return [
        (write(tmp_path, jsonl(*rows), "rows.jsonl"), lambda source, i: f"{source}:{i + 1}"),
        (write(tmp_path, json.dumps(rows), "rows.json"), lambda source, i: f"{source}[{i}]"),
        (str(tmp_path / "rows.parquet"), lambda source, i: f"{source}[{i}]"),
        (str(tmp_path / "ds"), lambda source, i: f"{source}[{i}]"),
        (f"hf:acme/{tmp_path.name}", lambda source, i: f"{source}[{i}]"),
    ]


def test_the_plan_checks_the_first_rows_of_every_format(tmp_path, datasets_cache):
    """A wrong column name or role stops check_sources (the dry run) in every format, with the
    source and the row named; in skip mode when none of the first rows can be used."""
    import re

    renamed = [{"text": f"question {i}", "answer": "x"} for i in range(8)]  # `prompt` under another name
    for source, row in _in_every_format(tmp_path / "renamed", renamed, datasets_cache):
        with pytest.raises(PromptError, match=rf"^{re.escape(row(source, 0))}: none of the fields messages, "
                                              r"conversations, prompt \(the row has: answer, text\)"):
            check_sources([source], on_bad_row="stop")
        with pytest.raises(PromptError, match=rf"^{re.escape(source)}: none of its first 5 rows can be used, so "
                                              rf"prompts.on_bad_row: skip would reject the whole source; the first: "
                                              rf"{re.escape(row(source, 0))}: none of the fields"):
            check_sources([source], on_bad_row="skip")
    # a bad role in the third row: stop mode names it; skip mode lets the job reject that row alone
    robot = [GOOD, {"messages": SAME[:1]}, {"messages": [{"role": "robot", "content": "x"}]}, GOOD]
    for source, row in _in_every_format(tmp_path / "robot", robot, datasets_cache):
        with pytest.raises(PromptError, match=rf"^{re.escape(row(source, 2))}: messages\[0\] has unknown role 'robot'"):
            check_sources([source], on_bad_row="stop")
        check_sources([source], on_bad_row="skip")
        check_sources([source], on_bad_row="stop", rows=2)  # only the first rows are read


def test_the_plan_reads_a_json_list_from_its_head(tmp_path):
    """A JSON list of several MB is not parsed whole at plan time: rows past the head are the job's."""
    rows = [{"prompt": f"question {i} " + "x" * 1000} for i in range(3000)]
    path = write(tmp_path, json.dumps(rows, ensure_ascii=False)[:-1] + ', {"prompt": ', "big.json")  # cut off at the end
    assert Path(path).stat().st_size > 2 * 2**20  # the plan reads 1 MiB first
    check_sources([path], on_bad_row="skip")  # its head is fine; its cut-off end is the job's to record
    first_bad = write(tmp_path, json.dumps([{"prompt": ""}, *rows]), "first_bad.json")
    with pytest.raises(PromptError, match=rf"^{first_bad}\[0\]: `prompt` has empty content"):
        check_sources([first_bad])


def test_check_sources_fails_fast_on_the_first_row(tmp_path):
    path = write(tmp_path, jsonl({"prompt": "no answer"}))
    check_sources([path], regenerate_enabled=True)
    with pytest.raises(PromptError, match=rf"{path}:1: .*ends with a user turn"):
        check_sources([path], regenerate_enabled=False)
    # skip mode: the job would reject every row of the source, which stops it too
    with pytest.raises(PromptError, match=rf"{path}: none of its first 1 rows can be used"):
        check_sources([path], regenerate_enabled=False, on_bad_row="skip")
    with pytest.raises(PromptError, match="twice"):
        check_sources([path, path])


def test_skip_mode_writes_rejects_with_reasons_and_counts(tmp_path, caplog):
    rows = [GOOD, BAD_ROWS["unknown_role"][0], {"prompt": "fine"}, BAD_ROWS["empty_conversation"][0]]
    path = write(tmp_path, jsonl(*rows) + '{"broken": ')
    train, held, rejects, summary = build(tmp_path, [path], on_bad_row="skip")
    assert len(train) + len(held) == 2
    assert [(r["source"], r["line"], r["code"]) for r in rejects] == [
        (path, 2, "unknown_role"),
        (path, 4, "empty_conversation"),
        (path, 5, "truncated_last_line"),
    ]
    assert all(r["reason"] and r["fix"] for r in rejects)
    assert json.loads(rejects[0]["raw"]) == BAD_ROWS["unknown_role"][0]
    assert rejects[2]["raw"] == '{"broken": '
    source = summary["sources"][0]
    assert (source["rows_read"], source["kept"], source["rejected"]) == (5, 2, 3)
    assert source["rejected_reasons"] == {"empty_conversation": 1, "truncated_last_line": 1, "unknown_role": 1}
    assert "rejected 3 rows" in caplog.text


def test_rejects_file_written_empty_when_nothing_rejected(tmp_path):
    _, _, rejects, summary = build(tmp_path, [MESSAGES], on_bad_row="skip")
    assert rejects == [] and summary["totals"]["rejected"] == 0
    assert (tmp_path / "out" / "rejects.jsonl").read_text() == ""


def test_a_source_whose_rows_are_all_rejected_stops_skip_mode_too(tmp_path):
    """skip leaves out bad rows, never a whole source: a file with the wrong column name (every
    row rejected) stops the prompts step even beside a good source, naming it and its first row."""
    good = write(tmp_path, jsonl(GOOD, {"prompt": "fine"}), "good.jsonl")
    renamed = write(tmp_path, jsonl(*({"text": f"hello {i}"} for i in range(8))), "renamed.jsonl")
    with pytest.raises(PromptError, match=rf"^{renamed}: all 8 rows were rejected \(unknown_format: 8\); prompts.on_bad_row: "
                                          rf"skip leaves out bad rows, never a whole source. The first: {renamed}:1: none of the "
                                          r"fields messages, conversations, prompt \(the row has: text\) \(fix: .*; or remove the "
                                          r"source from prompts.sources\)$"):
        collect([good, renamed], on_bad_row="skip")
    # some rows rejected: kept going, counted per source
    mixed = write(tmp_path, jsonl({"text": "x"}, GOOD, {"prompt": "fine"}), "mixed.jsonl")
    summary = collect([mixed], on_bad_row="skip").summary
    assert (summary["sources"][0]["rejected"], summary["sources"][0]["kept"]) == (1, 2)


# ----------------------------------------------------------------------------------- the split


def many(tmp_path, n, name="many.jsonl"):
    return write(tmp_path, jsonl(*({"prompt": f"question {i}", "response": f"answer {i}"} for i in range(n))), name)


def test_validation_test_and_max_samples_disjoint_and_deterministic(tmp_path):
    path = many(tmp_path, 50)
    a = collect([path], validation=6, test=4, max_samples=25, seed=3)
    b = collect([path], validation=6, test=4, max_samples=25, seed=3)
    assert (a.train, a.validation, a.test) == (b.train, b.validation, b.test)
    train_ids = {r["id"] for r in a.train}
    val_ids = {r["id"] for r in a.validation}
    test_ids = {r["id"] for r in a.test}
    assert (len(train_ids), len(val_ids), len(test_ids)) == (25, 6, 4)
    assert not train_ids & val_ids and not train_ids & test_ids and not val_ids & test_ids
    assert (a.summary["train"], a.summary["validation"], a.summary["test"], a.summary["over_max_samples"]) == (25, 6, 4, 15)
    # shuffled, not the file order
    assert [r["messages"][0]["content"] for r in a.validation] != [f"question {i}" for i in range(6)]
    # the held-out sets do not depend on max_samples; another seed gives another split
    assert collect([path], validation=6, test=4, seed=3).test == a.test
    assert len(collect([path], validation=6, test=4, seed=3).train) == 40
    assert {r["id"] for r in collect([path], validation=6, test=4, seed=4).validation} != val_ids


def test_a_larger_test_set_keeps_the_validation_set_and_never_takes_its_rows(tmp_path):
    """Settings chosen on the validation set stay honest: growing the test set takes rows
    after the validation set, never the ones choices were made on."""
    path = many(tmp_path, 50)
    small = collect([path], validation=6, test=4, seed=3)
    large = collect([path], validation=6, test=10, seed=3)
    assert large.validation == small.validation
    assert large.test[:4] == small.test
    assert not {r["id"] for r in large.test} & {r["id"] for r in small.validation}


def test_written_outputs_are_identical_across_runs(tmp_path):
    path = many(tmp_path, 20)
    settings = dict(validation=3, test=2, max_samples=8, seed=1)
    build(tmp_path / "one", [path], **settings)
    build(tmp_path / "two", [path], **settings)
    for name in ("prompts.jsonl", "validation.jsonl", "test.jsonl", "rejects.jsonl", "summary.json"):
        assert (tmp_path / "one" / "out" / name).read_bytes() == (tmp_path / "two" / "out" / name).read_bytes()


def test_held_out_sets_leaving_no_training_rows_is_an_error(tmp_path):
    path = many(tmp_path, 5)
    with pytest.raises(PromptError, match=r"prompts.validation \+ prompts.test is 3 \+ 2 but only 5"):
        collect([path], validation=3, test=2)


def test_first_turns_of_a_prompt_set_in_any_format(tmp_path):
    from draftline.sources import read_first_turns

    path = write(tmp_path, jsonl(
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi?"},
                           {"from": "gpt", "value": "Hello."}, {"from": "human", "value": "More?"}]},
        {"prompt": "Name a planet."},
        {"prompt": "Name a planet."},
    ))
    rows = read_first_turns(path)
    assert [m for _, m in rows] == [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
        [{"role": "user", "content": "Name a planet."}],
    ]
    bad = write(tmp_path, jsonl({"prompt": "ok"}) + "{not json\n", "bad.jsonl")
    with pytest.raises(PromptError, match=r"bad.jsonl:2"):
        read_first_turns(bad)


# ------------------------------------------------------------------- tool calls and thinking

TOOL_CALLS = str(DATA / "tool_calls.jsonl")


def test_tool_rows_in_every_row_shape_keep_tools_calls_results_and_thinking(tmp_path):
    """OpenAI `messages` (arguments as JSON strings, parallel calls), ShareGPT `function_call` /
    `observation` with `tools` as a JSON string of flat schemas, and a plain `prompt` with tools:
    normalized alike, arguments as objects, the thinking kept where the row had it."""
    train, _, rejects, _ = build(tmp_path, [TOOL_CALLS])
    assert not rejects and len(train) == 4
    rows = {r["messages"][1 if r["messages"][0]["role"] == "system" else 0]["content"]: r for r in train}
    paris = rows["What is the weather in Paris?"]
    assert [m["role"] for m in paris["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    call = paris["messages"][2]
    assert call["reasoning_content"] == "I should call the weather tool." and call["content"] == ""
    assert call["tool_calls"] == [{"id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert paris["messages"][3] == {"role": "tool", "content": '{"temperature": 21, "sky": "clear"}', "tool_call_id": "call_1"}
    assert [t["function"]["name"] for t in paris["tools"]] == ["get_weather", "add"]
    two = rows["Weather in Rome and in Oslo?"]
    assert [m["role"] for m in two["messages"]] == ["user", "assistant", "tool", "tool", "assistant", "user", "assistant"]
    sharegpt = rows["What is 2 + 2?"]
    assert sharegpt["tools"] == [{"type": "function", "function": json.loads(
        json.loads(Path(TOOL_CALLS).read_text().splitlines()[2])["tools"])[0]}]
    assert sharegpt["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]}
    assert sharegpt["messages"][2] == {"role": "tool", "content": "4"}
    from draftline.sources import normalize_conversation  # an export's empty tool_calls: no calls

    assert normalize_conversation({"messages": [*SAME[:1], {**SAME[1], "tool_calls": []}]}, True).messages == SAME
    prompt = rows["Add 3 and 4, please."]
    assert prompt["messages"][1]["content"].startswith("<think>\nA small sum.\n</think>")
    assert prompt["tools"][0]["function"]["name"] == "add"


def test_tool_rows_from_parquet_are_the_same_conversations_as_from_jsonl(tmp_path):
    """Parquet fills a key one row lacks with null (the tools' differing parameters, a turn's
    absent tool_calls): the rows read back as the JSONL ones, with the same ids."""
    import datasets

    rows = [json.loads(line) for line in Path(TOOL_CALLS).read_text().splitlines()[:2]]
    path = tmp_path / "tools.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    check_sources([str(path)])
    from_parquet, _, _, summary = build(tmp_path / "p", [path])
    jsonl_path = write(tmp_path, jsonl(*rows), "tools.jsonl")
    from_jsonl, _, _, _ = build(tmp_path / "j", [jsonl_path])
    assert summary["sources"][0]["format"] == "parquet"
    strip = [{k: v for k, v in r.items() if k != "source"} for r in from_parquet]
    assert strip == [{k: v for k, v in r.items() if k != "source"} for r in from_jsonl]


CALL = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
WEATHER = json.loads(Path(TOOL_CALLS).read_text().splitlines()[1])["tools"]
ASK = {"role": "user", "content": "Weather?"}
BAD_TOOL_ROWS = {
    "unknown_tool": ({"tools": WEATHER, "messages": [ASK, {"role": "assistant", "content": "", "tool_calls": [
        {**CALL, "function": {"name": "get_time", "arguments": "{}"}}]}]},
        r"messages\[1\]\.tool_calls\[0\] calls 'get_time', but its `tools` declare \['get_weather'\]"),
    "calls without tools": ({"messages": [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]}]},
                            r"messages\[1\]\.tool_calls\[0\] calls 'get_weather', but it has no `tools`"),
    "bad_json_field": ({"tools": WEATHER, "messages": [ASK, {"role": "assistant", "content": "", "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{city: Paris}"}}]}]},
        r"messages\[1\]\.tool_calls\[0\]\.function\.arguments the arguments is a string that is not valid JSON"),
    "tool_without_call": ({"messages": [ASK, {"role": "assistant", "content": "Hi"}, {"role": "tool", "content": "4"}]},
                          r"messages\[2\] is a tool result that answers no call"),
    "tool_results_missing": ({"tools": WEATHER, "messages": [
        ASK, {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "d"}]},
        {"role": "tool", "content": "21"}, {"role": "assistant", "content": "Warm."}]},
        r"messages\[3\] is assistant while 1 of the calls of messages\[1\] have no tool result yet"),
    "bad_tools": ({"tools": [{"type": "function", "function": {"description": "no name"}}], "messages": [ASK]},
                  r"`tools\[0\]\.function\.name` is missing"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOOL_ROWS))
def test_bad_tool_rows_name_file_row_and_field_at_plan_time(tmp_path, case):
    """check_sources (the dry run) reads the first rows: a bad tools field, call or result stops
    it naming the JSONL line or the Parquet row and the field, in both formats."""
    import datasets

    row, message = BAD_TOOL_ROWS[case]
    path = write(tmp_path, jsonl({"tools": WEATHER, "messages": [ASK]}, row))
    with pytest.raises(PromptError, match=rf"src\.jsonl:2: {message}"):
        check_sources([path])
    parquet = tmp_path / "bad.parquet"
    datasets.Dataset.from_list([{k: json.dumps(v) if k == "tools" else v for k, v in row.items()}]).to_parquet(str(parquet))
    with pytest.raises(PromptError, match=rf"bad\.parquet\[0\]: {message}"):
        check_sources([str(parquet)])


def test_tools_and_thinking_enter_the_conversation_id_and_plain_rows_keep_theirs():
    """The id hashes the tools, calls and thinking too, and a row of text turns keeps the id it
    always had (staged answers and hidden states of earlier runs stay theirs)."""
    import hashlib

    from draftline.sources import conversation_id, normalize_conversation

    plain = normalize_conversation({"messages": SAME}, True)
    before = hashlib.sha256(json.dumps([[m["role"], m["content"]] for m in SAME], separators=(",", ":")).encode()).hexdigest()
    assert conversation_id(plain.messages, plain.tools) == before[:16]
    with_tools = normalize_conversation({"messages": SAME, "tools": WEATHER}, True)
    thinking = normalize_conversation({"messages": [SAME[0], {**SAME[1], "reasoning_content": "Small."}]}, True)
    ids = {conversation_id(c.messages, c.tools) for c in (plain, with_tools, thinking)}
    assert len(ids) == 3


# ---------------------------------------------------------------- data as users have it (ShareGPT)


def test_a_json_list_cut_off_mid_row_stops_the_plan_or_keeps_its_complete_rows(tmp_path):
    """ShareGPT's packaged file ends inside a row: stop says so when the plan is made (its last bytes
    alone); skip keeps every complete row before the break and records the break as a reject."""
    rows = [{"conversations": [{"from": "human", "value": f"question {i}"}]} for i in range(5)]
    text = json.dumps(rows, indent=1)
    path = write(tmp_path, text[: text.rindex('"question 4"')], "cut.json")  # the fifth row is cut off
    with pytest.raises(PromptError, match=rf"^{path}: the JSON list is cut off.*on_bad_row: skip"):
        check_sources([path])
    with pytest.raises(PromptError, match=rf"^{path}: the JSON list is cut off"):  # the job says it too
        collect([path])
    train, held, rejects, summary = build(tmp_path, [path], on_bad_row="skip")
    assert sorted(r["messages"][0]["content"] for r in train) == [f"question {i}" for i in range(4)]
    assert [(r["line"], r["code"]) for r in rejects] == [(4, "truncated_list")]
    assert summary["sources"][0]["rejected_reasons"] == {"truncated_list": 1}
    assert re.search(r"cut off at line \d+: 4 complete rows before the break", rejects[0]["reason"])
    whole = write(tmp_path, text, "whole.json")
    check_sources([whole])  # a list that closes passes
    broken = write(tmp_path, text.replace('"question 2"', '"question 2" oops', 1), "broken.json")
    with pytest.raises(PromptError, match="malformed JSON"):  # broken inside, not cut off: no rows guessed
        collect([broken], on_bad_row="skip")


def test_a_leading_assistant_turn_is_dropped_and_counted_or_rejected(tmp_path):
    """ShareGPT's cleaned split cuts long chats into pieces that begin with the assistant's turn: by
    default that turn goes and the rest is kept, counted; `reject` keeps today's refusal."""
    piece = {"conversations": [{"from": "gpt", "value": "...and that is the end."}, {"from": "human", "value": "Thanks! Next?"},
                               {"from": "gpt", "value": "Sure."}]}
    system = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi."},
                           {"role": "assistant", "content": "Hello?"}, {"role": "user", "content": "Hello."}]}
    path = write(tmp_path, jsonl(piece, system, GOOD))
    train, _, rejects, summary = build(tmp_path, [path])
    kept = {r["messages"][0]["content"]: r["messages"] for r in train}
    assert [m["role"] for m in kept["Thanks! Next?"]] == ["user", "assistant"]
    assert [m["role"] for m in kept["Be brief."]] == ["system", "user"]  # the system turn stays
    assert summary["sources"][0]["changed"] == {"leading_assistant_turn_dropped": 3} and not rejects
    with pytest.raises(PromptError, match=r":1: .*is assistant where user was expected"):
        collect([path], leading_assistant_turn="reject")
    check_sources([path])
    with pytest.raises(PromptError, match="where user was expected"):
        check_sources([path], leading_assistant_turn="reject")


def test_sharegpts_other_assistants_are_read_as_the_assistant_and_counted(tmp_path):
    rows = [{"conversations": [{"from": "human", "value": f"q{i}"}, {"from": role, "value": "an answer"}]}
            for i, role in enumerate(["chatgpt", "bing", "Bard", "bing"])]
    train, _, rejects, summary = build(tmp_path, [write(tmp_path, jsonl(*rows))])
    assert len(train) == 4 and not rejects and all(r["messages"][1]["role"] == "assistant" for r in train)
    assert summary["sources"][0]["changed"] == {"role_bard_as_assistant": 1, "role_bing_as_assistant": 2,
                                                "role_chatgpt_as_assistant": 1}


def test_a_package_source_is_read_from_the_installed_package(tmp_path, monkeypatch):
    """`package:MODULE/PATH` finds a file a package ships (a preset types no path); a package that
    is not installed names the pip command."""
    from draftline.sources.spec import resolve_source

    package = tmp_path / "site" / "demo_prompts"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "rows.jsonl").write_text(jsonl(GOOD))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = "package:demo_prompts/data/rows.jsonl"
    assert resolve_source(spec) == str(package / "data" / "rows.jsonl")
    check_sources([spec])
    train, _, _, summary = build(tmp_path, [spec])
    assert len(train) == 1 and train[0]["source"] == spec and summary["sources"][0]["path"] == spec
    with pytest.raises(PromptError, match=r"has no data/other.jsonl"):
        check_sources(["package:demo_prompts/data/other.jsonl"])
    with pytest.raises(PromptError, match=r"'no_such_module_here' is not installed.*pip install no-such-module-here"):
        resolve_source("package:no_such_module_here/a.json")

