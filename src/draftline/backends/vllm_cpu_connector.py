"""vLLM's hidden-states connector, made to run on the CPU build.

The stock `ExampleHiddenStatesConnector` copies each finished request's states out of the
KV cache on a CUDA stream into pinned host memory ("pin_memory=True requires a CUDA ...
backend" on CPU). On CPU the cache already lives in host memory, so this subclass gathers the
rows synchronously and hands the stock writer thread a completed "event". Everything else
(scheduler bookkeeping, `.lock` files, file naming, the writer pool) is the stock code.

speculators' `FP8HiddenStatesConnector` (hs-connectors) is a subclass of the stock connector
that overrides only the writer (`_write_tensors`: per-token FP8 quantization), so it inherits the
same CUDA-only copy; `CPUFP8HiddenStatesConnector` combines this class's copy with its writer.

Loaded by vLLM with `"kv_connector": "CPUHiddenStatesConnector"` (or
`"CPUFP8HiddenStatesConnector"`), `"kv_connector_module_path": "draftline.backends.vllm_cpu_connector"`.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from hs_connectors.fp8_hidden_states_connector import FP8HiddenStatesConnector
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _DoneEvent:
    """Stands in for the CUDA event the stock writer and `get_finished` poll."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    """`ExampleHiddenStatesConnector` with a synchronous copy out of a host-memory KV cache."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None

        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slot_mapping = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        # Advanced indexing copies, so the blocks may be freed as soon as this returns.
        hidden_states = extract_from_kv_cache(
            self._kv_cache, slot_mapping, pending.token_ids.shape[0]
        )
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}

        assert pending.req_id not in self._req_futures, "duplicate hidden-states request id"
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)

        done = _DoneEvent()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))


class CPUFP8HiddenStatesConnector(CPUHiddenStatesConnector, FP8HiddenStatesConnector):
    """speculators' FP8 connector on CPU: the synchronous copy above, speculators' FP8 writer."""
