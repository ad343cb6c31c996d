"""Hidden-state backends: what computes the target's hidden states for a list of dataset rows.

The hidden-state stage (`draftline.stages.hidden_states`) owns everything around a backend: which
rows a shard holds, the staging folder that survives a killed job, validation of every file,
the manifest and the atomic publish. A backend only turns token ids into validated
`hs_<row>.safetensors` files (`draftline.artifacts.hidden_states`) in `request.dest`.

To add one: write `draftline/backends/<name>.py` with a module-level `BACKEND` object that
has `name` and `extract(request) -> Extracted`, and add one line to `BACKENDS` below (and the
name to `hidden_states.backend`'s enum in the config schema).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from draftline.runtime.vllm_engine import EngineSettings
from draftline.settings import DEFAULTS, HiddenStateFormat

# name (config `hidden_states.backend`) -> module holding BACKEND; imported only when chosen
BACKENDS = {
    "vllm": "draftline.backends.vllm",
    "transformers": "draftline.backends.transformers",
}


@dataclass(frozen=True)
class ExtractionRequest:
    """Rows to extract, and where each validated file goes."""

    target_dir: str
    hidden_size: int
    extracted: list[int]  # layer ids, the last one = the target's last layer
    rows: Sequence[int]
    token_ids: dict[int, list[int]]  # row -> its input_ids
    dest: Path  # hs_<row>.safetensors land here, each validated
    engine: EngineSettings  # dtype resolved; threads, eager mode, trust_remote_code
    rows_per_call: int = 64  # rows per engine call / per batch
    # hidden_states.format: full (the engine dtype) or fp8 (speculators' FP8 layout)
    format: HiddenStateFormat = DEFAULTS.hidden_states.format
    options: dict = field(default_factory=dict)  # the backend's own (e.g. batch_tokens)


@dataclass(frozen=True)
class Extracted:
    tokens: int
    load_seconds: float
    extract_seconds: float
    # where extract_seconds went, by phase, where the backend tells them apart (the manifest's
    # extract_seconds_by_phase; vllm: run_chunks' ChunkTimes)
    seconds_by_phase: dict[str, float] = field(default_factory=dict)


class Backend(Protocol):
    name: str

    def extract(self, request: ExtractionRequest) -> Extracted: ...


def get(name: str) -> Backend:
    """The backend registered as `name`; a clear error for an unknown one."""
    if name not in BACKENDS:
        raise ValueError(f"hidden_states.backend {name!r}: expected one of {', '.join(sorted(BACKENDS))}")
    return importlib.import_module(BACKENDS[name]).BACKEND
