"""Hidden states from vLLM's own `extract_hidden_states` method (`hidden_states.backend: vllm`).

The engine runs each row as a prompt with max_tokens=1; its KV connector writes the captured
layers of every token to a safetensors file in a scratch folder (a `.lock` beside it is held
until the write ends). Each file is validated and moved to the request's `dest`. On CUDA the
stock `ExampleHiddenStatesConnector` writes (format fp8: speculators' `FP8HiddenStatesConnector`);
on CPU `CPUHiddenStatesConnector` (the stock one without pinned memory and CUDA streams; format
fp8: `CPUFP8HiddenStatesConnector`, the same copy with speculators' FP8 writer).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from draftline.artifacts.hidden_states import file_name, validate_hidden_state_file
from draftline.backends import Extracted, ExtractionRequest
from draftline.runtime.vllm_engine import has_cuda, shutdown, target_llm
from draftline.settings import DEFAULTS, HiddenStateFormat

log = logging.getLogger(__name__)

CPU_CONNECTOR = "CPUHiddenStatesConnector"
CPU_CONNECTOR_MODULE = "draftline.backends.vllm_cpu_connector"
CUDA_CONNECTOR = "ExampleHiddenStatesConnector"  # vLLM's stock connector
# hidden_states.format fp8: speculators' connector (hs-connectors), and its CPU twin here
CPU_FP8_CONNECTOR = "CPUFP8HiddenStatesConnector"
CUDA_FP8_CONNECTOR = "FP8HiddenStatesConnector"
CUDA_FP8_CONNECTOR_MODULE = "hs_connectors.fp8_hidden_states_connector"


def connector(format: HiddenStateFormat = DEFAULTS.hidden_states.format, cuda: bool | None = None) -> dict:
    """The kv_transfer_config entries naming the connector that writes `format` files."""
    cuda = has_cuda() if cuda is None else cuda
    if cuda:
        if format == "fp8":
            return {"kv_connector": CUDA_FP8_CONNECTOR, "kv_connector_module_path": CUDA_FP8_CONNECTOR_MODULE}
        return {"kv_connector": CUDA_CONNECTOR}
    name = CPU_FP8_CONNECTOR if format == "fp8" else CPU_CONNECTOR
    return {"kv_connector": name, "kv_connector_module_path": CPU_CONNECTOR_MODULE}


def extraction_engine_kwargs(extracted: Sequence[int], storage_dir: str | Path,
                             format: HiddenStateFormat = DEFAULTS.hidden_states.format) -> dict:
    """`vllm.LLM` keyword arguments that turn generation into hidden-state extraction."""
    return {
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(extracted)}},
        },
        "kv_transfer_config": {
            **connector(format),
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)},
        },
    }


class Extractor:
    """Runs rows through an extraction engine; each validated file lands in `dest_dir`."""

    def __init__(self, llm, n_layers: int, hidden_size: int, dtype: str, format: HiddenStateFormat = DEFAULTS.hidden_states.format):
        self.llm = llm
        self.n_layers = n_layers
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.format = format

    def generate(self, token_ids: Sequence[Sequence[int]]):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in token_ids]
        return self.llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)

    def finish(self, rows, token_ids, outputs, dest_dir: Path) -> int:
        """Wait for each output's file, validate it, move it to `dest_dir/hs_<row>`; return tokens."""
        tokens = 0
        for row, ids, out in zip(rows, token_ids, outputs, strict=True):
            path = (out.kv_transfer_params or {}).get("hidden_states_path")
            if path is None:
                raise RuntimeError(
                    f"dataset row {row}: vLLM returned no hidden_states_path; the engine must run "
                    "with the extract_hidden_states method and a hidden-states connector"
                )
            _wait_for_write(path)
            tokens += validate_hidden_state_file(
                path, ids, self.n_layers, self.hidden_size, row=row, dtype=self.dtype, format=self.format
            )
            os.chmod(path, 0o644)  # safetensors writes 0600; the files are shared data
            os.replace(path, dest_dir / file_name(row))
        return tokens


def _wait_for_write(path: str) -> None:
    """Block until vLLM's writer releases the file's `.lock`, then remove the lock file.

    The writer holds an exclusive flock from before the request is returned until the file is
    complete; it is released when the write ends or the engine process dies, so this cannot
    wait forever on a dead writer.
    """
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock)


@dataclass
class ChunkTimes:
    """Where `run_chunks`' seconds went: the engine's calls (`prefill`: the forward over the rows, the
    connector's copies of their states off the device and its writes as far as the engine waits for
    them), the wait for an earlier chunk's files while nothing was being prefilled (`waiting_for_files`:
    the chunk's finish took longer than the next prefill), and the last chunk's files, which no
    prefill overlaps (`last_chunk_files`). Their sum is the call's time but for the loop itself."""

    tokens: int = 0
    prefill: float = 0.0
    waiting_for_files: float = 0.0
    last_chunk_files: float = 0.0

    def by_phase(self) -> dict[str, float]:
        return {"prefill": round(self.prefill, 2), "waiting_for_files": round(self.waiting_for_files, 2),
                "last_chunk_files": round(self.last_chunk_files, 2)}


def run_chunks(extractor: Extractor, rows: Sequence[int], ids_by_row, dest_dir: Path,
               chunk_rows: int = 64) -> ChunkTimes:
    """Extract `rows` in chunks into `dest_dir`, logging progress; return the tokens and the times.

    Reading back and validating chunk i overlaps with the engine computing chunk i+1.
    """
    times = ChunkTimes()
    done_rows = 0
    t0 = time.perf_counter()

    def finish(chunk, ids, outputs) -> None:
        nonlocal done_rows
        times.tokens += extractor.finish(chunk, ids, outputs, dest_dir)
        done_rows += len(chunk)
        elapsed = time.perf_counter() - t0
        eta = (len(rows) - done_rows) * elapsed / done_rows
        log.info("rows %d/%d, %d tokens, %.0f tokens/s, eta %.0f s", done_rows, len(rows),
                 times.tokens, times.tokens / elapsed, eta)

    pending = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        for i in range(0, len(rows), chunk_rows):
            chunk = list(rows[i : i + chunk_rows])
            ids = [ids_by_row[r] for r in chunk]
            t = time.perf_counter()
            outputs = extractor.generate(ids)
            times.prefill += time.perf_counter() - t
            if pending is not None:
                t = time.perf_counter()
                pending.result()
                times.waiting_for_files += time.perf_counter() - t
            pending = pool.submit(finish, chunk, ids, outputs)
        if pending is not None:
            t = time.perf_counter()
            pending.result()
            times.last_chunk_files = time.perf_counter() - t
    log.info("extraction's %.1f s: prefill %.1f, waiting for an earlier chunk's files %.1f, the last chunk's "
             "files %.1f", time.perf_counter() - t0, times.prefill, times.waiting_for_files, times.last_chunk_files)
    return times


class VllmBackend:
    name = "vllm"

    def extract(self, request: ExtractionRequest) -> Extracted:
        scratch = request.dest / "vllm"
        shutil.rmtree(scratch, ignore_errors=True)  # partial writes of a killed run
        scratch.mkdir()
        # Room for the prompt plus the one generated token; no prefix caching: every row is computed.
        settings = replace(request.engine, max_model_len=max(len(request.token_ids[r]) for r in request.rows) + 1)
        t0 = time.perf_counter()
        # in_process=False: the connector finishes writing a row's file (and releases its lock, which
        # _wait_for_write waits for) in the engine core's next step, so the core must run beside
        # this process; in this process the last chunk's wait would never end
        llm = target_llm(
            request.target_dir, settings, enable_prefix_caching=False, in_process=False,
            extraction=True,  # its GPU share (vllm_engine.gpu_memory_share)
            **extraction_engine_kwargs(request.extracted, scratch, request.format),
        )
        load_s = time.perf_counter() - t0
        log.info("engine ready in %.1f s", load_s)
        extractor = Extractor(llm, len(request.extracted), request.hidden_size, settings.dtype, request.format)
        t1 = time.perf_counter()
        try:
            times = run_chunks(extractor, request.rows, request.token_ids, request.dest, request.rows_per_call)
            extract_s = time.perf_counter() - t1
        finally:
            shutdown(llm)
        shutil.rmtree(scratch, ignore_errors=True)
        return Extracted(times.tokens, load_s, extract_s, times.by_phase())


BACKEND = VllmBackend()
