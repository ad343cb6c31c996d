"""The `datasets` library, for the two sources it reads (save_to_disk folders and `hf:` datasets
in its local cache), through its public API only: `load_from_disk`, `load_dataset` and
`load_dataset_builder` with the hub offline.

Imported only when such a source is configured: `import datasets` (pandas with it) costs the plan
0.46-0.60 s wall on an idle 2-core machine, after pyarrow, and 0.9-2 s on a loaded one (measured
with datasets 5.1), which a plan of JSONL sources, the default, does not pay. Each load after it
takes milliseconds (memory-mapped).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

from draftline.sources.errors import RawRow, as_raw_row

# The variables huggingface_hub and datasets read for offline mode (datasets reads them once, at
# import, into datasets.config.HF_HUB_OFFLINE, which is set for the call too).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


@contextlib.contextmanager
def datasets_library(offline: bool = False) -> Iterator[Any]:
    """`datasets`, with its log lines and progress bars quiet for the call (the plan prints its own
    lines), and with `offline` the hub off: rows come from the local cache only, so they cannot
    change under a run, and a dataset not cached is never downloaded."""
    import datasets
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    verbosity, bars_off = datasets.logging.get_verbosity(), are_progress_bars_disabled()
    environment = {name: os.environ.get(name) for name in OFFLINE_VARIABLES}
    hub_offline = datasets.config.HF_HUB_OFFLINE
    datasets.logging.set_verbosity_error()
    disable_progress_bars()
    if offline:
        os.environ.update(dict.fromkeys(OFFLINE_VARIABLES, "1"))
        datasets.config.HF_HUB_OFFLINE = True
    try:
        yield datasets
    finally:
        datasets.config.HF_HUB_OFFLINE = hub_offline
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        datasets.logging.set_verbosity(verbosity)
        if not bars_off:
            enable_progress_bars()


def dataset_rows(dataset: Any) -> Iterator[RawRow]:
    """A `datasets.Dataset`'s rows as `dataset[i]` gives them."""
    for index, value in enumerate(dataset):
        yield as_raw_row(index, value)


def first_dataset_rows(dataset: Any, n: int) -> list[RawRow]:
    """The first `n` of a `datasets.Dataset`'s rows (the plan-time check reads no more)."""
    with contextlib.closing(dataset_rows(dataset)) as rows:
        return list(itertools.islice(rows, n))
