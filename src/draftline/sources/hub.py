"""Hub datasets already in the local `datasets` cache (`hf:ORG/NAME[/CONFIG][:SPLIT]`), read with
`datasets.load_dataset` offline: never downloaded here, so the rows cannot change under a run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from draftline.sources.datasets_library import dataset_rows, datasets_library, first_dataset_rows
from draftline.sources.errors import PromptError, RawRow, no_rows
from draftline.sources.spec import HubSource, hub_source


def _hub(raw: str) -> HubSource:
    hub = hub_source(raw)
    if hub is None:
        raise PromptError(f"{raw}: not a hub dataset source (fix: write hf:ORG/NAME[/CONFIG][:SPLIT])")
    return hub


def _not_cached(raw: str, hub: HubSource, cache: Any) -> PromptError:
    return PromptError(
        f"{raw}: {hub.repo_id}{f' (config {hub.config})' if hub.config else ''} is not in the local "
        f"datasets cache ({cache}); draftline reads hub datasets offline, so the rows cannot "
        "change under a run (fix: load it once where there is network, with the same HF_DATASETS_CACHE "
        f"or HF_HOME: python -c \"import datasets; {hub.call()}\")"
    )


def _load_failed(raw: str, hub: HubSource, exc: Exception) -> PromptError:
    why = str(exc).replace("\n", " ")
    return PromptError(
        f"{raw}: {hub.call()} from the local cache failed: {why} (fix: name a cached split as "
        f"{hub.with_split('SPLIT')}, or load it once with network)"
    )


def open_hub(raw: str) -> Any:
    """The cached split as a `datasets.Dataset`; not cached, or no such split or config: PromptError."""
    hub = _hub(raw)
    with datasets_library(offline=True) as datasets:
        try:
            return datasets.load_dataset(hub.repo_id, hub.config, split=hub.split)
        except (ConnectionError, FileNotFoundError):  # offline, datasets found no cached copy
            raise _not_cached(raw, hub, datasets.config.HF_DATASETS_CACHE) from None
        except Exception as exc:  # a missing split or config, a damaged cache: datasets raises several types
            raise _load_failed(raw, hub, exc) from None


def load_hub(raw: str) -> Any:
    """The cached split, which has rows."""
    dataset = open_hub(raw)
    if len(dataset) == 0:
        raise no_rows(raw, "empty split", "name another split or remove it from prompts.sources")
    return dataset


def read_hub(raw: str) -> Iterator[RawRow]:
    yield from dataset_rows(load_hub(raw))


def first_hub_rows(raw: str, n: int) -> list[RawRow]:
    return first_dataset_rows(load_hub(raw), n)


def count_hub_rows(raw: str) -> int | str:
    """The split's size from the cached dataset's info (`load_dataset_builder`), no row read."""
    hub = _hub(raw)
    with datasets_library(offline=True) as datasets:
        try:
            builder = datasets.load_dataset_builder(hub.repo_id, hub.config)
        except (ConnectionError, FileNotFoundError):
            raise _not_cached(raw, hub, datasets.config.HF_DATASETS_CACHE) from None
        except Exception as exc:  # a missing config, a damaged cache
            raise _load_failed(raw, hub, exc) from None
    split = (builder.info.splits or {}).get(hub.split)
    if split is None or split.num_examples is None:
        return f"no cached dataset_info.json gives the size of split {hub.split!r}"
    return int(split.num_examples)


def hub_files(raw: str) -> list[str]:
    """The cached files the split is read from: a new download of the dataset changes them."""
    return [f["filename"] for f in open_hub(raw).cache_files]
