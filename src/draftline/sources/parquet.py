"""Parquet files, read with pyarrow a batch at a time: row i is the file's i-th row."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from draftline.sources.errors import PromptError, RawRow, as_raw_row, no_rows


def read_parquet(raw: str) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(raw)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        raise PromptError(
            f"{raw}: cannot be read as Parquet ({exc}) (fix: rewrite it, e.g. with "
            "pandas.DataFrame.to_parquet or datasets.Dataset.to_parquet)"
        ) from None
    if table.metadata.num_rows == 0:
        raise no_rows(raw, "empty Parquet file")
    index = 0
    for batch in table.iter_batches(batch_size=1024):
        for value in batch.to_pylist():
            yield as_raw_row(index, value)
            index += 1


def first_parquet_rows(raw: str, n: int) -> list[RawRow]:
    with contextlib.closing(read_parquet(raw)) as rows:
        return list(itertools.islice(rows, n))


def count_parquet_rows(raw: str) -> int:
    """From the file's metadata, no row read."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(raw).metadata.num_rows
