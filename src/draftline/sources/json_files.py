"""JSONL files and `.json` lists, read by draftline itself: only a reader of its own can name the
line of a malformed, truncated or non-UTF-8 row (`file:7`) and read a file's head at plan time."""

from __future__ import annotations

import codecs
import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

from draftline.sources.errors import BadRow, PromptError, RawRow, as_raw_row, no_rows

# A .json list is parsed whole to count its rows before the first job; above this size the
# count waits for the prompts job (parsing it at plan time would slow every dry run).
COUNT_JSON_LIST_MAX_BYTES = 64 << 20


def is_json_list(path: Path) -> bool:
    """A .json file holding one list of rows (a .json file of JSON lines is read as JSONL)."""
    if path.suffix != ".json" or not path.is_file():
        return False
    with path.open("rb") as handle:
        head = handle.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()
    return head[:1] == b"["


# ------------------------------------------------------------------------------------- JSONL


def read_jsonl(raw: str) -> Iterator[RawRow]:
    """Streamed line by line, so check_sources can stop after the first row."""
    empty = True
    with Path(raw).open("rb") as handle:
        for number, chunk in enumerate(handle, start=1):
            if number == 1:
                chunk = chunk.removeprefix(b"\xef\xbb\xbf")
            if not chunk.strip():
                continue  # blank lines are not rows
            empty = False
            yield _parse_line(number, chunk)
    if empty:
        raise no_rows(raw, "empty file")


def first_jsonl_rows(raw: str, n: int) -> list[RawRow]:
    with contextlib.closing(read_jsonl(raw)) as rows:
        return list(itertools.islice(rows, n))  # an all-blank file raises PromptError here


def count_lines(raw: str) -> int:
    """The file's lines, blank ones and a last line without its newline included."""
    lines = 0
    with Path(raw).open("rb") as handle:
        last = b"\n"
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


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


# ---------------------------------------------------------------------------------- JSON list


def read_json_list(raw: str) -> Iterator[RawRow]:
    try:
        text = Path(raw).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PromptError(
            f"{raw}: bytes that are not UTF-8 at byte {exc.start} (fix: re-save the file as UTF-8)"
        ) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        if not _ends_its_list(text):  # cut off: the complete rows, then the break as a bad row
            yield from _rows_before_the_break(raw, text)
            return
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
        raise no_rows(raw, "empty list")
    for index, value in enumerate(rows):
        yield as_raw_row(index, value)


def _ends_its_list(text: str) -> bool:
    return text.rstrip().endswith("]")


def list_cut_off(raw: str) -> str | None:
    """Why a .json list is cut off (its last bytes do not close the list), else None: read from the
    file's end alone, so the plan can say so at any size."""
    with Path(raw).open("rb") as handle:
        handle.seek(max(0, Path(raw).stat().st_size - 64))
        tail = handle.read().rstrip()
    if tail.endswith(b"]"):
        return None
    return "the JSON list is cut off: the file ends inside a row, not with the list's closing `]` (a truncated download or copy?)"


def _rows_before_the_break(raw: str, text: str) -> Iterator[RawRow]:
    """The complete rows of a list cut off mid-row, then one bad row that records the break: where
    (file line) and after how many complete rows."""
    decoder = json.JSONDecoder()
    at, index = _skip_separators(text, text.index("[") + 1), 0
    while True:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        yield as_raw_row(index, value)
        index, at = index + 1, _skip_separators(text, end)
    line = text.count("\n", 0, at) + 1
    yield RawRow(index, text[at:at + 200], error=BadRow(
        "truncated_list",
        f"the JSON list is cut off at line {line}: {index} complete rows before the break were read, the row "
        "that begins there ends with the file",
        "a truncated download or copy: fetch the file again; prompts.on_bad_row: skip keeps the complete rows",
    ))


def first_json_list_rows(raw: str, n: int) -> list[RawRow]:
    """The first `n` elements of a .json list, decoded from the file's head (read in growing
    pieces: a list of gigabytes is not parsed whole at plan time). A file that is not UTF-8, not
    well-formed where it was read, or empty is left to the full parse, whose message names it."""
    path = Path(raw)
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
                out.append(as_raw_row(len(out), value))
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
    return list(itertools.islice(read_json_list(raw), n))


def count_json_list(raw: str) -> int | str:
    """The list's length, or why it waits for the prompts job (a list too large to parse here)."""
    size = Path(raw).stat().st_size
    if size > COUNT_JSON_LIST_MAX_BYTES:
        return f"a JSON list of {size / 2**20:,.0f} MiB, counted by the prompts job (or write it as .jsonl)"
    return len(json.loads(Path(raw).read_bytes().decode("utf-8-sig")))


def _skip_separators(text: str, at: int) -> int:
    while at < len(text) and (text[at].isspace() or text[at] == ","):
        at += 1
    return at
