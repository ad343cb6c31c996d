"""The formats a source comes in, each read by its own module; which one a source is.

A new format is a module of its own with the five functions of `Format`, one entry here and a
branch in `format_of`; check_sources (the plan) and the prompts job both read through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draftline.sources.dataset_folder import (
    count_folder_rows,
    first_folder_rows,
    folder_files,
    open_folder,
    read_folder,
)
from draftline.sources.errors import RawRow
from draftline.sources.hub import count_hub_rows, first_hub_rows, hub_files, open_hub, read_hub
from draftline.sources.json_files import (
    count_json_list,
    count_lines,
    first_json_list_rows,
    first_jsonl_rows,
    is_json_list,
    read_json_list,
    read_jsonl,
)
from draftline.sources.parquet import count_parquet_rows, first_parquet_rows, read_parquet
from draftline.sources.spec import check_path, hub_source


@dataclass(frozen=True)
class Format:
    name: str  # summary.json's `format` of the source
    indexed: bool  # rows are named file[7] (from 0), else file:7 (a line, from 1)
    check: Callable[[str], object]  # there and readable as this format, else PromptError
    read: Callable[[str], Iterator[RawRow]]  # every row, streamed
    first_rows: Callable[[str, int], list[RawRow]]  # the first n, without reading the rest
    count: Callable[[str], int | str]  # rows without reading them, or why not (for the plan)
    files: Callable[[str], list[str]]  # the files behind it, for a rule's input


def _the_file(raw: str) -> list[str]:
    return [raw]


JSONL = Format("jsonl", False, check_path, read_jsonl, first_jsonl_rows, count_lines, _the_file)
JSON_LIST = Format("json", True, check_path, read_json_list, first_json_list_rows, count_json_list, _the_file)
PARQUET = Format("parquet", True, check_path, read_parquet, first_parquet_rows, count_parquet_rows, _the_file)
DATASET = Format("dataset", True, open_folder, read_folder, first_folder_rows, count_folder_rows, folder_files)
HUB = Format("hub", True, open_hub, read_hub, first_hub_rows, count_hub_rows, hub_files)


def format_of(raw: str) -> Format:
    """The format of a source: HUB for `hf:...`, DATASET for a folder, JSON_LIST for a `.json` file
    holding a list, PARQUET for a `.parquet` file, else JSONL (a path that is not there too: its
    check says so)."""
    if hub_source(raw) is not None:
        return HUB
    path = Path(raw)
    if path.is_dir():
        return DATASET
    if is_json_list(path):
        return JSON_LIST
    if path.suffix == ".parquet":
        return PARQUET
    return JSONL
