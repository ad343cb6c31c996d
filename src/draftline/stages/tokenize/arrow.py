"""The kept rows streamed into an Arrow file, a batch at a time, and their fingerprint (write_rows_arrow)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

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
