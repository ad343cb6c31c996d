"""Folders written by `datasets.Dataset.save_to_disk`, read with `datasets.load_from_disk`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftline.sources.datasets_library import dataset_rows, datasets_library, first_dataset_rows
from draftline.sources.errors import PromptError, RawRow, no_rows


def open_folder(raw: str) -> Any:
    """The folder's `datasets.Dataset` (memory-mapped); a DatasetDict, a folder save_to_disk did
    not write or a damaged one: PromptError."""
    with datasets_library() as datasets:
        try:
            dataset = datasets.load_from_disk(raw)
        except FileNotFoundError as exc:  # neither a Dataset's folder nor a DatasetDict's, or files missing
            raise PromptError(
                f"{raw}: a folder that was not written by datasets.save_to_disk, or lacks some of its files "
                f"(datasets.load_from_disk: {exc}) (fix: point prompts.sources at a JSONL file or a "
                "save_to_disk folder, or write it again with Dataset.save_to_disk)"
            ) from None
        except IndexError as exc:  # datasets 5.1 reads a dataset saved without rows (no data file) so
            raise PromptError(
                f"{raw}: cannot be loaded with datasets.load_from_disk (IndexError: {exc}), as a dataset saved "
                "without rows cannot (fix: add conversations or remove it from prompts.sources; else write it "
                "again with Dataset.save_to_disk)"
            ) from None
        except Exception as exc:  # datasets and pyarrow raise several types for a damaged folder
            raise PromptError(
                f"{raw}: cannot be loaded with datasets.load_from_disk ({exc}) "
                "(fix: rewrite it with Dataset.save_to_disk)"
            ) from None
        if isinstance(dataset, datasets.DatasetDict):
            splits = list(dataset)
            raise PromptError(
                f"{raw}: a DatasetDict with splits {splits}, not one dataset (fix: list the "
                f"split's folder, e.g. {raw}/{splits[0] if splits else 'train'})"
            )
    return dataset


def load_folder(raw: str) -> Any:
    """The folder's dataset, which has rows."""
    dataset = open_folder(raw)
    if len(dataset) == 0:
        raise no_rows(raw, "empty dataset")
    return dataset


def read_folder(raw: str) -> Iterator[RawRow]:
    yield from dataset_rows(load_folder(raw))


def first_folder_rows(raw: str, n: int) -> list[RawRow]:
    return first_dataset_rows(load_folder(raw), n)


def count_folder_rows(raw: str) -> int:
    return len(open_folder(raw))


def folder_files(raw: str) -> list[str]:
    """Every file in the folder: rewriting them in place does not change the folder's mtime."""
    return [str(p) for p in sorted(Path(raw).rglob("*")) if p.is_file()]
