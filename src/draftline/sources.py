"""The training data a user brings: prompt and conversation files in the formats users have.

A source is a JSONL file, a `.json` list, a `.parquet` file, a `datasets.save_to_disk` folder,
or a hub dataset already in the local `datasets` cache (`hf:ORG/NAME[/CONFIG][:SPLIT]`, read
offline), with rows in one of three shapes: OpenAI `messages` [{role, content}], ShareGPT `conversations`
[{from, value}], or a plain `prompt` string (with optional `system`, `response`/`completion`).
Any of them may carry `tools` (OpenAI function schemas, or a JSON string of them), `tool`
messages (ShareGPT: `observation`) and assistant `tool_calls` (ShareGPT: `function_call`), and an
assistant turn's thinking (`reasoning_content`, `reasoning` or `thinking`).
`normalize_conversation` turns each into `messages` (+ `tools`); `conversation_id` hashes only
the normalized conversation, so one conversation has one id whatever its source or format. Read by the prompts
stage (training data) and by evaluation (`evaluate.prompt_sets`); a new format is one reader
here.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import itertools
import json
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROLES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "tool": "tool",
    "observation": "tool",  # ShareGPT's tool result
    "function_call": "assistant",  # ShareGPT's tool call (its value is the call's JSON)
}
ROW_FIELDS = ("messages", "conversations", "prompt")
# Files a datasets.save_to_disk folder holds (a DatasetDict has dataset_dict.json instead).
_DATASET_MARKERS = ("state.json", "dataset_info.json")
# A hub dataset from the local datasets cache: hf:ORG/NAME[/CONFIG][:SPLIT] (split: train).
HUB_PREFIX = "hf:"


class PromptError(ValueError):
    """A prompt source or row that cannot be used; the message says where and how to fix it."""


@dataclass
class BadRow(Exception):
    """One unusable row: `code` groups reasons in summary.json, `reason`/`fix` are for people."""

    code: str
    reason: str
    fix: str

    def __str__(self) -> str:
        return f"{self.reason} (fix: {self.fix})"


@dataclass
class SourceStats:
    path: str
    format: str = ""
    rows_read: int = 0
    kept: int = 0
    duplicates: int = 0
    rejected: int = 0
    rejected_reasons: Counter = field(default_factory=Counter)
    train: int = 0
    validation: int = 0
    test: int = 0

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "format": self.format,
            "rows_read": self.rows_read,
            "kept": self.kept,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "rejected_reasons": dict(sorted(self.rejected_reasons.items())),
            "train": self.train,
            "validation": self.validation,
            "test": self.test,
        }


@dataclass
class RawRow:
    """A row as read: `line` is the 1-based line of a JSONL file or the index of an indexed row."""

    line: int
    text: str
    value: Any = None
    error: BadRow | None = None


def where(path: str, line: int, indexed: bool) -> str:
    """`file:7` for a JSONL line, `folder[7]` for row 7 of a dataset or a JSON list."""
    return f"{path}[{line}]" if indexed else f"{path}:{line}"


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


def _is_dataset_folder(path: Path) -> bool:
    return any((path / m).is_file() for m in _DATASET_MARKERS)


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    config: str | None
    split: str


def hub_source(raw: str) -> HubSource | None:
    """The hub dataset a source names (`hf:ORG/NAME[/CONFIG][:SPLIT]`), None for a path."""
    if not raw.startswith(HUB_PREFIX):
        return None
    spec, _, split = raw[len(HUB_PREFIX):].partition(":")
    parts = spec.split("/")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts) or (":" in raw[len(HUB_PREFIX):] and not split):
        raise PromptError(
            f"{raw}: not a hub dataset source (fix: write hf:ORG/NAME, hf:ORG/NAME:SPLIT or "
            "hf:ORG/NAME/CONFIG:SPLIT, e.g. hf:HuggingFaceH4/ultrachat_200k:train_sft)"
        )
    return HubSource("/".join(parts[:2]), parts[2] if len(parts) == 3 else None, split or "train")


def _hub_cache_root(hub: HubSource) -> Path:
    # datasets' own cache layout: <HF_DATASETS_CACHE>/<org>___<name>/<config>/<version>/<hash>/
    from datasets import config
    from datasets.naming import camelcase_to_snakecase

    org, name = hub.repo_id.split("/")
    return Path(config.HF_DATASETS_CACHE) / f"{org}___{camelcase_to_snakecase(name)}"


def _hub_cache_dirs(raw: str, hub: HubSource) -> list[Path]:
    """The cached versions of `hub` (what datasets.load_dataset reads offline); none: PromptError."""
    root = _hub_cache_root(hub)
    found = sorted(p for p in root.glob(f"{hub.config or '*'}/*/*") if p.is_dir())
    if not found:
        configs = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        raise PromptError(
            f"{raw}: {hub.repo_id}{f' (config {hub.config})' if hub.config else ''} is not in the local "
            f"datasets cache ({root}{f'; cached configs: {configs}' if configs else ''}); draftline reads hub "
            "datasets offline, so the rows cannot change under a run (fix: load it once where there is "
            f"network, with the same HF_DATASETS_CACHE or HF_HOME: python -c \"import datasets; "
            f"datasets.load_dataset('{hub.repo_id}'{f', {hub.config!r}' if hub.config else ''}, split='{hub.split}')\")"
        )
    return found


# Rows of each source checked at plan time (fields, roles, turn order), the first ones only, so a
# wrong column name or format stops the dry run rather than the prompts job, at any source size.
CHECKED_ROWS = 5


def check_sources(
    paths: Sequence[str], regenerate_enabled: bool = True, on_bad_row: str = "stop", rows: int = CHECKED_ROWS
) -> None:
    """Fail fast (at Snakemake parse time) on a source that is missing, empty or unreadable, or
    whose first rows cannot be used.

    Cheap in every format: the first `rows` rows of each source are read (a JSONL file's first
    lines, a JSON list's first elements, a Parquet file's first batch, the first Arrow batch of a
    save_to_disk folder or of a cached hub split) and validated as the prompts job validates them.
    In stop mode the first bad one stops the plan; in skip mode only a source whose rows read are
    all bad does (a wrong column name or format: the job would reject all of it). The full check
    happens in the prompts job. `rows=0` checks that the sources exist and nothing more.
    """
    seen: set[str] = set()
    for raw in paths:
        if raw in seen:
            raise PromptError(
                f"prompts.sources lists {raw} twice (fix: list each source once; duplicate "
                "conversations across different sources are removed automatically)"
            )
        seen.add(raw)
        hub = hub_source(raw)
        if hub is not None:
            _hub_cache_dirs(raw, hub)
        else:
            _check_exists(raw, Path(raw))
        if rows > 0:
            indexed, head = _first_rows(raw, rows)
            _check_rows(raw, indexed, head, regenerate_enabled, on_bad_row)


def _check_rows(raw: str, indexed: bool, head: list[RawRow], regenerate_enabled: bool, on_bad_row: str) -> None:
    bad: list[tuple[RawRow, BadRow]] = []
    for row in head:
        try:
            if row.error:
                raise row.error
            normalize_conversation(row.value, regenerate_enabled)
        except BadRow as error:
            if on_bad_row == "stop":
                raise row_error(raw, row.line, indexed, error) from None
            bad.append((row, error))
    if head and len(bad) == len(head):
        row, error = bad[0]
        raise PromptError(
            f"{raw}: none of its first {len(head)} rows can be used, so prompts.on_bad_row: skip would "
            f"reject the whole source; the first: {where(raw, row.line, indexed)}: {error.reason} "
            f"(fix: {error.fix}; or remove the source from prompts.sources)"
        )


def _first_rows(raw: str, n: int) -> tuple[bool, list[RawRow]]:
    """(indexed, the first `n` rows) of a source, read without loading it whole."""
    hub = hub_source(raw)
    if hub is not None:
        return True, _first_arrow_rows(raw, _hub_split_files(raw, hub), n)
    path = Path(raw)
    if path.is_dir():
        state = json.loads((path / "state.json").read_text())
        return True, _first_arrow_rows(raw, [path / f["filename"] for f in state["_data_files"]], n)
    if _is_json_list(path):
        return True, _first_json_list_rows(raw, path, n)
    if path.suffix == ".parquet":
        with contextlib.closing(_read_parquet(raw, path)) as rows:
            return True, list(itertools.islice(rows, n))
    with contextlib.closing(_read_jsonl(raw, path)) as rows:
        return False, list(itertools.islice(rows, n))  # an all-blank file raises PromptError here


def _first_arrow_rows(raw: str, files: list[Path], n: int) -> list[RawRow]:
    """The first rows of a datasets Arrow table (save_to_disk, or datasets' cache) as
    `dataset[i]` gives them, read with pyarrow: importing datasets would cost the plan seconds."""
    import pyarrow as pa

    out: list[RawRow] = []
    for file in files:
        try:
            reader = pa.ipc.open_stream(pa.memory_map(str(file)))
            for batch in reader:
                for value in batch.slice(0, n - len(out)).to_pylist():
                    out.append(RawRow(len(out), _dump(value), value))
                if len(out) >= n:
                    return out
        except (OSError, pa.ArrowInvalid) as exc:
            raise PromptError(
                f"{raw}: {file} cannot be read as an Arrow file ({exc}) (fix: rewrite the dataset with "
                "Dataset.save_to_disk, or load the hub dataset again)"
            ) from None
    if not out:
        raise PromptError(f"{raw}: empty dataset, no rows (fix: add conversations or remove it from prompts.sources)")
    return out


def _hub_split_files(raw: str, hub: HubSource) -> list[Path]:
    """The Arrow files datasets' cache holds for the split (<name>-<split>[-NNNNN-of-NNNNN].arrow)."""
    folders = _hub_cache_dirs(raw, hub)
    for folder in reversed(folders):
        files = sorted([*folder.glob(f"*-{hub.split}.arrow"), *folder.glob(f"*-{hub.split}-[0-9]*-of-[0-9]*.arrow")])
        if files:
            return files
    cached = sorted(p.name for d in folders for p in d.glob("*.arrow"))
    raise PromptError(
        f"{raw}: split {hub.split!r} is not in the local datasets cache ({', '.join(map(str, folders))} "
        f"holds {cached or 'no Arrow file'}) (fix: name a cached split as "
        f"{HUB_PREFIX}{hub.repo_id}{f'/{hub.config}' if hub.config else ''}:SPLIT, or load it once with network)"
    )


def _first_json_list_rows(raw: str, path: Path, n: int) -> list[RawRow]:
    """The first `n` elements of a .json list, decoded from the file's head (read in growing
    pieces: a list of gigabytes is not parsed whole at plan time). A file that is not UTF-8, not
    well-formed where it was read, or empty is left to the full parse, whose message names it."""
    decoder = json.JSONDecoder()
    size, total = 1 << 20, path.stat().st_size
    while True:
        with path.open("rb") as handle:
            head = handle.read(size)
        whole = len(head) >= total
        try:
            text = codecs.getincrementaldecoder("utf-8-sig")().decode(head, final=whole)
        except UnicodeDecodeError:
            break
        out: list[RawRow] = []
        at = _skip_separators(text, text.index("[") + 1)
        try:
            while len(out) < n and at < len(text) and text[at] != "]":
                value, at = decoder.raw_decode(text, at)
                out.append(RawRow(len(out), _dump(value), value))
                at = _skip_separators(text, at)
        except json.JSONDecodeError:
            if whole:
                break
            size *= 4  # the element goes on past what was read
            continue
        if len(out) == n or (out and whole) or (out and text[at:at + 1] == "]"):
            return out
        if whole:
            break
        size *= 4
    return list(itertools.islice(_read_json_list(raw, path), n))


def _skip_separators(text: str, at: int) -> int:
    while at < len(text) and (text[at].isspace() or text[at] == ","):
        at += 1
    return at


def source_files(paths: Sequence[str]) -> list[str]:
    """The files behind the sources, for a rule's input: a dataset folder's own files count,
    since rewriting them in place does not change the folder's mtime."""
    files: list[str] = []
    for raw in paths:
        hub = hub_source(raw)
        if hub is not None:  # the cached files load_dataset reads
            files.extend(str(p) for d in _hub_cache_dirs(raw, hub) for p in sorted(d.rglob("*")) if p.is_file())
            continue
        path = Path(raw)
        if path.is_dir():
            files.extend(str(p) for p in sorted(path.rglob("*")) if p.is_file())
        else:
            files.append(raw)
    return files


# A .json list is parsed whole to count its rows before the first job; above this size the
# count waits for the prompts job (parsing it at plan time would slow every dry run).
COUNT_JSON_LIST_MAX_BYTES = 64 << 20


def count_rows(paths: Sequence[str]) -> tuple[int | None, str | None]:
    """(rows, None) across the sources without reading the rows, or (None, why not): JSONL lines,
    a Parquet file's metadata, a save_to_disk folder's Arrow files (memory-mapped), a cached hub
    split's dataset_info.json, a small .json list parsed. Blank lines and bad rows are counted, so
    it is an upper bound of what the prompts job keeps. For the plan's estimates, at parse time."""
    total = 0
    for raw in paths:
        try:
            rows = _count_source(raw)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged source: the prompts job says how
            return None, f"{raw} could not be counted ({type(exc).__name__}: {exc})"
        if isinstance(rows, str):
            return None, f"{raw}: {rows}"
        total += rows
    return total, None


def _count_source(raw: str) -> int | str:
    hub = hub_source(raw)
    if hub is not None:
        for folder in reversed(_hub_cache_dirs(raw, hub)):
            splits = json.loads((folder / "dataset_info.json").read_text()).get("splits") or {}
            if hub.split in splits:
                return int(splits[hub.split]["num_examples"])
        return f"no cached dataset_info.json gives the size of split {hub.split!r}"
    path = Path(raw)
    if path.is_dir():
        import pyarrow as pa

        state = json.loads((path / "state.json").read_text())
        files = [path / f["filename"] for f in state["_data_files"]]
        return sum(pa.ipc.open_stream(pa.memory_map(str(f))).read_all().num_rows for f in files)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if _is_json_list(path):
        size = path.stat().st_size
        if size > COUNT_JSON_LIST_MAX_BYTES:
            return f"a JSON list of {size / 2**20:,.0f} MiB, counted by the prompts job (or write it as .jsonl)"
        return len(json.loads(path.read_bytes().decode("utf-8-sig")))
    lines = 0
    with path.open("rb") as handle:
        last = b"\n"
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def _check_exists(raw: str, path: Path) -> None:
    if not path.exists():
        raise PromptError(
            f"{raw}: prompt source not found (looked at {path.resolve()}) (fix: correct the path; "
            "relative paths are read from the folder snakemake runs in: the checkout, or "
            "the run folder given with --directory)"
        )
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
            raise PromptError(
                f"{raw}: a DatasetDict with splits {splits}, not one dataset (fix: list the "
                f"split's folder, e.g. {raw}/{splits[0] if splits else 'train'})"
            )
        if not _is_dataset_folder(path):
            raise PromptError(
                f"{raw}: a folder that was not written by datasets.save_to_disk (no state.json) "
                "(fix: point prompts.sources at a JSONL file or a save_to_disk folder)"
            )
    elif path.stat().st_size == 0:
        raise PromptError(f"{raw}: empty file (fix: add conversations or remove it from prompts.sources)")


def _is_json_list(path: Path) -> bool:
    """A .json file holding one list of rows (a .json file of JSON lines is read as JSONL)."""
    if path.suffix != ".json":
        return False
    with path.open("rb") as handle:
        head = handle.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()
    return head[:1] == b"["


def read_source(raw: str) -> tuple[str, bool, Iterator[RawRow]]:
    """(format, indexed, rows) of one source; file-level problems raise PromptError."""
    hub = hub_source(raw)
    if hub is not None:
        return "hub", True, _read_hub_dataset(raw, hub)
    path = Path(raw)
    _check_exists(raw, path)
    if path.is_dir():
        return "dataset", True, _read_dataset(raw, path)
    if _is_json_list(path):
        return "json", True, _read_json_list(raw, path)
    if path.suffix == ".parquet":
        return "parquet", True, _read_parquet(raw, path)
    return "jsonl", False, _read_jsonl(raw, path)


def _read_jsonl(raw: str, path: Path) -> Iterator[RawRow]:
    """Streamed line by line, so check_sources can stop after the first row."""
    empty = True
    with path.open("rb") as handle:
        for number, chunk in enumerate(handle, start=1):
            if number == 1:
                chunk = chunk.removeprefix(b"\xef\xbb\xbf")
            if not chunk.strip():
                continue  # blank lines are not rows
            empty = False
            yield _parse_line(number, chunk)
    if empty:
        raise PromptError(f"{raw}: empty file, no rows (fix: add conversations or remove it from prompts.sources)")


def _parse_line(number: int, chunk: bytes) -> RawRow:
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RawRow(
            number,
            chunk.decode("utf-8", errors="replace").rstrip("\r\n"),
            error=BadRow(
                "not_utf8",
                f"bytes that are not UTF-8 (0x{chunk[exc.start]:02x} at byte {exc.start + 1} of the line)",
                "re-save the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`",
            ),
        )
    try:
        return RawRow(number, text.rstrip("\r\n"), json.loads(text))
    except json.JSONDecodeError as exc:
        # Only the file's last line can lack its newline: a writer stopped mid-row.
        if not chunk.endswith(b"\n"):
            error = BadRow(
                "truncated_last_line",
                f"the last line is cut off mid-row ({exc.msg}, column {exc.colno})",
                "the file was probably truncated while being written: regenerate or repair it",
            )
        else:
            error = BadRow(
                "malformed_json",
                f"malformed JSON ({exc.msg}, column {exc.colno})",
                "each line must be one complete JSON object",
            )
        return RawRow(number, text.rstrip("\r\n"), error=error)


def _read_json_list(raw: str, path: Path) -> Iterator[RawRow]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PromptError(
            f"{raw}: bytes that are not UTF-8 at byte {exc.start} (fix: re-save the file as UTF-8)"
        ) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptError(
            f"{raw}:{exc.lineno}: malformed JSON ({exc.msg}, column {exc.colno}) "
            "(fix: repair the file; a .json source must hold one JSON list of rows)"
        ) from None
    if not isinstance(rows, list):
        raise PromptError(
            f"{raw}: holds a JSON {type(rows).__name__}, not a list of rows (fix: wrap the rows "
            "in [...] or write them one per line as .jsonl)"
        )
    if not rows:
        raise PromptError(f"{raw}: empty list, no rows (fix: add conversations or remove it from prompts.sources)")
    for index, value in enumerate(rows):
        yield RawRow(index, _dump(value), value)


def _read_dataset(raw: str, path: Path) -> Iterator[RawRow]:
    import datasets

    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises several types for a damaged folder
        raise PromptError(
            f"{raw}: cannot be loaded with datasets.load_from_disk ({exc}) "
            "(fix: rewrite it with Dataset.save_to_disk)"
        ) from None
    if len(dataset) == 0:
        raise PromptError(f"{raw}: empty dataset, no rows (fix: add conversations or remove it from prompts.sources)")
    for index, value in enumerate(dataset):
        yield RawRow(index, _dump(value), value)


def _read_parquet(raw: str, path: Path) -> Iterator[RawRow]:
    """Row by row, a batch at a time; row i is the file's i-th row."""
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        raise PromptError(
            f"{raw}: cannot be read as Parquet ({exc}) (fix: rewrite it, e.g. with "
            "pandas.DataFrame.to_parquet or datasets.Dataset.to_parquet)"
        ) from None
    if table.metadata.num_rows == 0:
        raise PromptError(f"{raw}: empty Parquet file, no rows (fix: add conversations or remove it from prompts.sources)")
    index = 0
    for batch in table.iter_batches(batch_size=1024):
        for value in batch.to_pylist():
            yield RawRow(index, _dump(value), value)
            index += 1


def _read_hub_dataset(raw: str, hub: HubSource) -> Iterator[RawRow]:
    """The split of a hub dataset from the local datasets cache, offline (never downloaded here)."""
    import datasets
    from datasets import config

    _hub_cache_dirs(raw, hub)
    offline, config.HF_HUB_OFFLINE = config.HF_HUB_OFFLINE, True  # the cache only, whatever the environment
    try:
        dataset = datasets.load_dataset(hub.repo_id, hub.config, split=hub.split)
    except Exception as exc:  # a missing split or config, a damaged cache: datasets raises several types
        raise PromptError(
            f"{raw}: datasets.load_dataset({hub.repo_id!r}{f', {hub.config!r}' if hub.config else ''}, "
            f"split={hub.split!r}) from the local cache failed: {exc} (fix: name a cached split as "
            f"{HUB_PREFIX}{hub.repo_id}{f'/{hub.config}' if hub.config else ''}:SPLIT, or load it once with network)"
        ) from None
    finally:
        config.HF_HUB_OFFLINE = offline
    if len(dataset) == 0:
        raise PromptError(f"{raw}: empty split, no rows (fix: name another split or remove it from prompts.sources)")
    for index, value in enumerate(dataset):
        yield RawRow(index, _dump(value), value)


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


def _get(mapping: dict, *keys: str) -> Any:
    """The first key present and not None (datasets fills absent columns with None)."""
    for key in keys:
        if mapping.get(key) is not None:
            return mapping[key]
    return None


@dataclass(frozen=True)
class Conversation:
    """A row as the prompts stage keeps it: its messages and the tools its calls may use."""

    messages: list[dict]
    tools: list[dict] | None = None


def normalize_row(value: Any, regenerate_enabled: bool) -> list[dict]:
    """The row's validated messages (`normalize_conversation`, without the tools)."""
    return normalize_conversation(value, regenerate_enabled).messages


def normalize_conversation(value: Any, regenerate_enabled: bool) -> Conversation:
    """The row's validated messages, roles system/user/assistant/tool (an assistant's `tool_calls`
    and `reasoning_content`, a tool result's `tool_call_id` and `name` kept), and its `tools`."""
    if not isinstance(value, dict):
        raise BadRow(
            "not_an_object",
            f"the row is a JSON {type(value).__name__}, not an object",
            "write each row as an object with `messages`, `conversations` or `prompt`",
        )
    kind = next((key for key in ROW_FIELDS if value.get(key) is not None), None)
    if kind is None:
        keys = ", ".join(sorted(value)) or "none"
        raise BadRow(
            "unknown_format",
            f"none of the fields {', '.join(ROW_FIELDS)} (the row has: {keys})",
            "give the row `messages` [{role, content}], `conversations` [{from, value}] or a `prompt` string",
        )
    if kind == "prompt" and not isinstance(value["prompt"], list):
        # A plain prompt; a list under `prompt` is read as messages (as speculators does).
        labelled = _prompt_turns(value)
    else:
        turns = value[kind]
        if not isinstance(turns, list):
            raise BadRow(
                "not_a_list",
                f"`{kind}` is a {type(turns).__name__}, not a list of turns",
                f"make `{kind}` a list of {{role, content}} objects",
            )
        labelled = [(f"{kind}[{i}]", turn) for i, turn in enumerate(turns)]
    tools = _normalize_tools(value.get("tools"))
    names = {t["function"]["name"] for t in tools} if tools else None
    messages = [_normalize_turn(at, turn, names) for at, turn in labelled]
    _validate_order(kind, messages, regenerate_enabled)
    return Conversation(messages, tools)


def _prompt_turns(value: dict) -> list[tuple[str, dict]]:
    """(field name, turn) pairs of a plain-prompt row, so errors name the field."""
    turns = []
    if value.get("system") is not None:
        turns.append(("`system`", {"role": "system", "content": value["system"]}))
    turns.append(("`prompt`", {"role": "user", "content": value["prompt"]}))
    for key in ("response", "completion"):
        if value.get(key) is not None:
            turns.append((f"`{key}`", {"role": "assistant", "content": value[key]}))
            break
    return turns


def _normalize_turn(at: str, turn: Any, tool_names: set[str] | None) -> dict:
    if not isinstance(turn, dict):
        raise BadRow(
            "bad_turn",
            f"{at} is a {type(turn).__name__}, not an object",
            "write each turn as {role, content} or {from, value}",
        )
    role = _get(turn, "role", "from")
    content = _get(turn, "content", "value")
    if role is None:
        raise BadRow("missing_role", f"{at} has no `role` (or `from`)", "give every turn a role")
    if not isinstance(role, str) or role.lower() not in ROLES:
        raise BadRow(
            "unknown_role",
            f"{at} has unknown role {role!r}",
            "use system, user, assistant or tool (ShareGPT: system, human, gpt, function_call or observation)",
        )
    if role.lower() == "function_call":  # ShareGPT's tool call: the value is the call's JSON
        return {"role": "assistant", "content": "", "tool_calls": _tool_calls(at, [_json(at, content, "value")], tool_names)}
    role = ROLES[role.lower()]
    calls = _get(turn, "tool_calls") if role == "assistant" else None
    calls = None if calls in ([], "", "[]") else calls  # OpenAI exports write [] for no calls
    message = {"role": role, "content": _content(at, content, may_be_empty=calls is not None)}
    if calls is not None:
        message["tool_calls"] = _tool_calls(f"{at}.tool_calls", calls, tool_names)
    if role == "assistant":
        reasoning = _get(turn, "reasoning_content", "reasoning", "thinking")  # speculators and vLLM read these
        if reasoning is not None and not isinstance(reasoning, str):
            raise BadRow("bad_content", f"{at} reasoning_content is a {type(reasoning).__name__}, not a string",
                         "give the answer's thinking as plain text")
        if reasoning and reasoning.strip():
            message["reasoning_content"] = reasoning
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if _get(turn, key) is not None:
                if not isinstance(turn[key], str):
                    raise BadRow("bad_tool_result", f"{at}.{key} is a {type(turn[key]).__name__}, not a string",
                                 f"give the tool result's {key} as a string, or leave it out")
                message[key] = turn[key]
    return message


def _content(at: str, content: Any, may_be_empty: bool) -> str:
    if content is None and may_be_empty:
        return ""
    if content is None:
        raise BadRow("missing_content", f"{at} has no `content` (or `value`)", "give every turn its text")
    if not isinstance(content, str):
        raise BadRow(
            "bad_content",
            f"{at} content is a {type(content).__name__}, not a string",
            "content must be plain text (multimodal parts are not supported)",
        )
    if not content.strip() and not may_be_empty:
        raise BadRow("empty_content", f"{at} has empty content", "fill in the turn's text or remove the turn")
    return content


def _json(at: str, value: Any, field_name: str) -> Any:
    """A field that may hold JSON as a string (Hermes' `tools`, OpenAI's `arguments`), decoded."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value) if value.strip() else None
    except json.JSONDecodeError as exc:
        raise BadRow("bad_json_field", f"{at} {field_name} is a string that is not valid JSON ({exc.msg}, column "
                     f"{exc.colno})", f"write {field_name} as JSON, or as the object itself") from None


def _drop_nulls(value: Any) -> Any:
    """Without null-valued keys: Parquet and datasets fill a key absent from one schema with null."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


TOOLS_FIX = "give `tools` as a list of OpenAI function schemas [{type: function, function: {name, description, parameters}}]"


def _normalize_tools(tools: Any) -> list[dict] | None:
    """`tools` as OpenAI function schemas (a flat {name, parameters} is wrapped); None when absent."""
    tools = _drop_nulls(_json("`tools`", tools, "`tools`"))
    if tools in (None, [], {}):
        return None
    if not isinstance(tools, list):
        raise BadRow("bad_tools", f"`tools` is a {type(tools).__name__}, not a list", TOOLS_FIX)
    out, names = [], set()
    for j, tool in enumerate(tools):
        if isinstance(tool, dict) and "function" not in tool and "name" in tool:
            tool = {"type": "function", "function": tool}
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise BadRow("bad_tools", f"`tools[{j}]` is not a function schema", TOOLS_FIX)
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise BadRow("bad_tools", f"`tools[{j}].function.name` is missing", TOOLS_FIX)
        if not isinstance(function.get("parameters", {}), dict):
            raise BadRow("bad_tools", f"`tools[{j}].function.parameters` is not an object (a JSON schema)", TOOLS_FIX)
        if name in names:
            raise BadRow("bad_tools", f"`tools[{j}]` declares {name!r} a second time", "declare each function once")
        names.add(name)
        out.append({**tool, "type": "function"})
    return out


def _tool_calls(at: str, calls: Any, tool_names: set[str] | None) -> list[dict]:
    """An assistant turn's calls as [{id?, type: function, function: {name, arguments: {...}}}]."""
    calls = _drop_nulls(_json(at, calls, "tool_calls"))
    if not isinstance(calls, list) or not calls:
        raise BadRow("bad_tool_call", f"{at} is not a list of calls", "give tool_calls as [{id, type, function: "
                     "{name, arguments}}], or leave it out")
    out = []
    for j, call in enumerate(calls):
        where_ = f"{at}[{j}]" if at.endswith("tool_calls") else at
        function = call.get("function", call) if isinstance(call, dict) else None  # flat {name, arguments} too
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise BadRow("bad_tool_call", f"{where_} has no function.name", "name the function each call calls")
        arguments = _json(f"{where_}.function.arguments", function.get("arguments"), "the arguments")
        if not isinstance(arguments, dict | None):
            raise BadRow("bad_tool_call", f"{where_}.function.arguments is a {type(arguments).__name__}, not an object",
                         "give a call's arguments as a JSON object")
        if tool_names is None or name not in tool_names:
            declared = f"its `tools` declare {sorted(tool_names)}" if tool_names else "it has no `tools`"
            raise BadRow("unknown_tool", f"{where_} calls {name!r}, but {declared}",
                         "give the row the `tools` its calls use, or correct the call's name")
        entry = {"type": "function", "function": {"name": name, "arguments": arguments or {}}}
        if isinstance(call, dict) and call.get("id") is not None:
            entry = {"id": str(call["id"]), **entry}
        out.append(entry)
    return out


TURN_ORDER = (
    "after an optional system message, turns go user, assistant, user, ...; an assistant turn with "
    "tool_calls is followed by one tool message per call, then the assistant again"
)


def _validate_order(kind: str, messages: list[dict], regenerate_enabled: bool) -> None:
    if not messages:
        raise BadRow("empty_conversation", f"`{kind}` is empty", "add at least one user turn or remove the row")
    roles = [m["role"] for m in messages]
    for i, role in enumerate(roles[1:], start=1):
        if role == "system":
            raise BadRow(
                "system_not_first",
                f"{kind}[{i}] is a system message after the first turn",
                "put the one system message first, or merge it into the user turn",
            )
    if "user" not in roles:
        raise BadRow("no_user_turn", "the conversation has no user turn", "add the user's prompt")
    expected, owed, caller = "user", 0, 0  # owed: tool results the last calls still wait for
    for i in range(1 if roles[0] == "system" else 0, len(roles)):
        role = roles[i]
        if role == "tool" and not owed:
            raise BadRow("tool_without_call", f"{kind}[{i}] is a tool result that answers no call ({TURN_ORDER})",
                         "give the assistant turn before it its tool_calls, or remove the tool message")
        if role != "tool" and owed:
            raise BadRow("tool_results_missing", f"{kind}[{i}] is {role} while {owed} of the calls of {kind}[{caller}] "
                         "have no tool result yet", "give every tool call its tool message, in the calls' order")
        if role != expected and role != "tool":
            raise BadRow(
                "not_alternating",
                f"{kind}[{i}] is {role} where {expected} was expected ({TURN_ORDER})",
                "merge consecutive turns of one role, or remove the extra turn",
            )
        if role == "tool":
            owed -= 1
            expected = "assistant"
        elif role == "assistant" and messages[i].get("tool_calls"):
            owed, caller, expected = len(messages[i]["tool_calls"]), i, "tool"
        else:
            expected = "assistant" if role == "user" else "user"
    if owed and roles[-1] == "tool":
        raise BadRow("tool_results_missing", f"{owed} of the calls of {kind}[{caller}] have no tool result",
                     "give every tool call its tool message, in the calls' order")
    if not regenerate_enabled and roles[-1] != "assistant":
        raise BadRow(
            "no_final_assistant",
            f"the conversation ends with a {roles[-1]} turn and regenerate.enabled is false, so there "
            "is no answer to train on",
            "add the assistant's answer, or set regenerate.enabled: true to have the target answer",
        )


# The message fields beyond role and content that enter a conversation's id.
_ID_FIELDS = ("reasoning_content", "tool_calls", "tool_call_id", "name")


def conversation_id(messages: list[dict], tools: list[dict] | None = None) -> str:
    """A short, stable hash of the normalized messages and tools (independent of source and
    format; a row of plain text turns hashes as it always has)."""
    turns = []
    for m in messages:
        extra = {k: m[k] for k in _ID_FIELDS if m.get(k) is not None}
        turns.append([m["role"], m["content"], extra] if extra else [m["role"], m["content"]])
    payload = {"messages": turns, "tools": tools} if tools else turns
    canonical = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def row_error(source: str, line: int, indexed: bool, bad: BadRow) -> PromptError:
    return PromptError(f"{where(source, line, indexed)}: {bad.reason} (fix: {bad.fix})")


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------


def read_first_turns(raw: str) -> list[tuple[str, list[dict[str, str]]]]:
    """(id, first-turn messages) of every row of a prompt file in any format a source may have:
    the leading system turns and the first user turn, as regeneration asks its turn 1.

    A bad row stops with file, line and reason (as prompts.on_bad_row: stop does); duplicate
    conversations are kept once.
    """
    _, indexed, raw_rows = read_source(raw)
    out, seen = [], set()
    for row in raw_rows:
        try:
            if row.error:
                raise row.error
            conversation = normalize_conversation(row.value, regenerate_enabled=True)
        except BadRow as bad:
            raise row_error(raw, row.line, indexed, bad) from None
        messages, row_id = conversation.messages, conversation_id(conversation.messages, conversation.tools)
        if row_id in seen:
            continue
        seen.add(row_id)
        first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
        out.append((row_id, messages[: first_user + 1]))
    return out
