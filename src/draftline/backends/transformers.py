"""Hidden states from a transformers forward pass (`hidden_states.backend: transformers`).

For machines without vLLM, and as a cross-check of vLLM's extraction. It writes the same
validated files (`draftline.artifacts.hidden_states`) as the vLLM backend; only the forward
pass differs.

Convention (tests/test_hidden_states_hf.py checks it against vLLM, layer by layer): vLLM's
layer id i is transformers' `output_hidden_states=True` entry `hidden_states[i]` for
i < num_hidden_layers. Transformers' last entry has the final norm applied, while vLLM's
last id is the un-normed output of the last decoder layer, so that one is read from the
final norm's input (a forward pre-hook) instead.

Speed: rows are sorted by length and run in padded batches of up to `batch_tokens` tokens
through the decoder only (no lm_head: the logits are not needed). Each batch's states are
copied to pinned host memory on a side CUDA stream while the next batch computes, and
writer threads save and validate the files meanwhile.

Several GPUs: a job given more than one GPU (its `gpu` resource, target.tensor_parallel_size x
pipeline_parallel_size) splits the target's layers over all of them with accelerate's balanced
device map (`device_map`): whole decoder layers, about the same share of weights on each GPU, the
embeddings on the first. A batch enters on the first GPU, flows layer by layer through the others
(one GPU computes at a time: this is for targets that do not fit one GPU, not for speed), and the
captured layers are gathered onto the first GPU before the copy to the host.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from draftline.artifacts.hidden_states import file_name, validate_hidden_state_file
from draftline.backends import Extracted, ExtractionRequest
from draftline.runtime.vllm_engine import has_cuda
from draftline.settings import DEFAULTS, HiddenStateFormat

log = logging.getLogger(__name__)

DEFAULT_BATCH_TOKENS = 32768
WRITERS = 4
# bounds pinned host memory held by batches waiting to be written (2 or 4: the same rate on an H200, docs/gpu.md)
MAX_BATCHES_IN_FLIGHT = 4


def job_device_map(target_dir: str | Path, dtype: str, gpus: int, batch_tokens: int,
                   trust_remote_code: bool = False) -> dict[str, int] | None:
    """None for a job on one GPU (or none); else the split of the target over GPUs 0..gpus-1
    (`device_map_for`), leaving room for a batch of `batch_tokens` tokens on each."""
    from transformers import AutoConfig

    if gpus <= 1:
        return None
    config = AutoConfig.from_pretrained(str(target_dir), trust_remote_code=trust_remote_code)
    placement = device_map_for(config, gpu_memory(gpus, config, dtype, batch_tokens), dtype,
                               trust_remote_code=trust_remote_code, source=str(target_dir))
    log.info("target split over %d GPUs: %s", gpus, describe_device_map(placement))
    return placement


def load_decoder(
    target_dir: str | Path, dtype: str, device: str, trust_remote_code: bool = False, *,
    placement: dict | None = None,
):
    """The target's decoder stack (embeddings, layers, final norm) in eval mode on `device`, or
    split over GPUs as `placement` (a device map, `job_device_map`) says."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(target_dir), dtype=getattr(torch, dtype), device_map=placement or device,
        trust_remote_code=trust_remote_code,
    )
    decoder = model.get_decoder()
    if not hasattr(decoder, "norm"):
        raise ValueError(
            f"{target_dir}: the transformers backend reads the last layer from the decoder's final "
            f"norm input, but {type(decoder).__name__} has no `norm`; use hidden_states.backend: vllm"
        )
    return decoder.eval()


def activation_bytes(config, dtype: str, batch_tokens: int) -> int:
    """A bound on what one batch of `batch_tokens` tokens needs beside the weights on one GPU:
    every layer's output (output_hidden_states keeps them all), the gathered captured layers and
    the MLP's intermediate activations."""
    import torch

    itemsize = getattr(torch, dtype).itemsize
    hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
    intermediate = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
    return batch_tokens * itemsize * (hidden * (layers + 1 + 4) + 3 * intermediate)


def gpu_memory(gpus: int, config, dtype: str, batch_tokens: int) -> dict[int, int]:
    """Bytes of weights each of GPUs 0..gpus-1 may hold: its free memory now, less one batch's
    activations (`activation_bytes`) and 5% for CUDA's own allocations."""
    import torch

    reserve = activation_bytes(config, dtype, batch_tokens)
    return {i: max(0, int(torch.cuda.mem_get_info(i)[0] * 0.95) - reserve) for i in range(gpus)}


def device_map_for(
    config, max_memory: dict[int, int], dtype: str, *, trust_remote_code: bool = False, source: str = "the target",
) -> dict[str, int]:
    """Which GPU each module of the target goes to when split over the GPUs of `max_memory`
    (GPU index -> bytes of weights it may hold): accelerate's balanced map (`get_balanced_memory`,
    then `infer_auto_device_map`), computed on an empty (meta) model, so nothing is loaded and
    it runs anywhere. Decoder layers stay whole (the model's `_no_split_modules`), consecutive
    layers share a GPU. Stops, naming the sizes, when the target does not fit those GPUs."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.utils import compute_module_sizes, get_balanced_memory, infer_auto_device_map
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    no_split = sorted(model._no_split_modules or [])
    balanced = get_balanced_memory(model, max_memory=dict(max_memory), no_split_module_classes=no_split, dtype=torch_dtype)
    placement = dict(infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split, dtype=torch_dtype))
    off_gpu = sorted(name for name, where in placement.items() if not isinstance(where, int))
    if off_gpu:
        size = compute_module_sizes(model, dtype=torch_dtype)[""]
        room = ", ".join(f"GPU {i}: {b / 2**30:.1f} GiB" for i, b in sorted(max_memory.items()))
        raise ValueError(
            f"{source}: the target's {size / 2**30:.1f} GiB of {dtype} weights do not fit the job's "
            f"{len(max_memory)} GPU(s) ({room} free for weights after one batch's activations); "
            f"{len(off_gpu)} modules would be left over ({off_gpu[0]} ...). Give the hidden-state job more "
            "GPUs (target.pipeline_parallel_size or tensor_parallel_size: the job asks for their product), "
            "or use hidden_states.backend: vllm"
        )
    return placement


def describe_device_map(placement: dict) -> str:
    """'0: layers 0-13, embed_tokens; 1: layers 14-31, norm, ...' (GPU index: modules) for the job log."""
    by_device: dict = {}
    for name, where in placement.items():
        by_device.setdefault(where, []).append(name)
    parts = []
    for where, names in by_device.items():
        layers = [int(n.rsplit(".", 1)[1]) for n in names if n.rsplit(".", 1)[0].endswith("layers") and n[-1].isdigit()]
        others = [n.rsplit(".", 1)[-1] for n in names if not (n.rsplit(".", 1)[0].endswith("layers") and n[-1].isdigit())]
        span = [f"layers {min(layers)}-{max(layers)}"] if layers else []
        parts.append(f"{where}: " + ", ".join(span + others))
    return "; ".join(parts)


def batches(rows: Sequence[int], lengths: dict[int, int], batch_tokens: int, max_rows: int) -> list[list[int]]:
    """Rows sorted by length (longest first), grouped so that padded size <= batch_tokens.

    A row longer than `batch_tokens` gets a batch of its own.
    """
    out: list[list[int]] = []
    current: list[int] = []
    for r in sorted(rows, key=lambda r: (-lengths[r], r)):
        # Longest first: the first row of a batch sets its padded length.
        padded = lengths[current[0]] * (len(current) + 1) if current else lengths[r]
        if current and (padded > batch_tokens or len(current) >= max_rows):
            out.append(current)
            current = []
        current.append(r)
    if current:
        out.append(current)
    return out


def pad_batch(token_ids: Sequence[Sequence[int]]):
    """Right-padded input ids and the attention mask of a batch of rows (CPU tensors)."""
    import torch

    longest = max(map(len, token_ids))
    ids = torch.zeros((len(token_ids), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(token_ids):
        ids[b, : len(row)] = torch.as_tensor(row)
        mask[b, : len(row)] = 1
    return ids, mask


class HFExtractor:
    """Runs batches through the decoder and hands each row's states to writer threads."""

    def __init__(self, decoder, extracted: Sequence[int], hidden_size: int, dtype: str,
                 format: HiddenStateFormat = DEFAULTS.hidden_states.format):
        import torch

        self.decoder = decoder
        self.extracted = list(extracted)
        self.n = int(decoder.config.num_hidden_layers)
        if self.extracted[-1] != self.n:
            raise ValueError(f"the last extracted layer must be {self.n}, got {self.extracted}")
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.format = format  # hidden_states.format
        # A batch enters where the embeddings are (with a device map, the first GPU); the
        # captured layers are gathered there (`forward`).
        self.device = decoder.get_input_embeddings().weight.device
        self.cuda = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._last: list = []
        decoder.norm.register_forward_pre_hook(lambda mod, args: self._last.append(args[0]))

    def forward(self, token_ids: Sequence[Sequence[int]]):
        """Stacked states [batch, max_len, n_extracted, hidden] on the device (right-padded)."""
        import torch

        ids, mask = pad_batch(token_ids)
        self._last.clear()
        with torch.inference_mode():
            out = self.decoder(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                output_hidden_states=True, use_cache=False,
            )
            if len(out.hidden_states) != self.n + 1 or len(self._last) != 1:
                raise RuntimeError(
                    f"{type(self.decoder).__name__} returned {len(out.hidden_states)} hidden states "
                    f"(expected {self.n + 1}) and called its final norm {len(self._last)} times "
                    "(expected 1): this architecture does not follow the Llama layout"
                )
            layers = [out.hidden_states[i] for i in self.extracted[:-1]] + [self._last[0]]
            # split over GPUs, each layer's states stay where it ran: gather them on the first
            states = torch.stack([t.to(self.device) for t in layers], dim=2)
        self._last.clear()
        return states

    def to_host(self, states):
        """Start the device->host copy; return (host tensor, event to wait on)."""
        import torch

        if not self.cuda:
            return states, None
        host = torch.empty(states.shape, dtype=states.dtype, pin_memory=True)
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            host.copy_(states, non_blocking=True)
            states.record_stream(self.copy_stream)
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        return host, event


def _write_row(path: Path, states, ids: Sequence[int], row: int, extractor: HFExtractor) -> int:
    """One row's file, written under a temporary name, validated as every staged file is, then renamed."""
    import torch
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    tensors = {"hidden_states": states.contiguous(), "token_ids": torch.as_tensor(list(ids), dtype=torch.long)}
    if extractor.format == "fp8":  # speculators' own quantizer and layout, as its FP8 connector writes them
        from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8

        tensors["hidden_states"], tensors[SCALES_KEY] = quantize_tensor_to_fp8(tensors["hidden_states"])
    save_file(tensors, str(tmp))
    # The same check the vLLM path runs on every file before it is staged.
    tokens = validate_hidden_state_file(tmp, ids, len(extractor.extracted), extractor.hidden_size, row=row,
                                        dtype=extractor.dtype, format=extractor.format)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return tokens


def run_batches(
    extractor: HFExtractor, rows: Sequence[int], ids_by_row, dest_dir: Path, *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS, max_rows: int = 64, writers: int = WRITERS,
) -> int:
    """Extract `rows` into `dest_dir/hs_<row>.safetensors`; return the token count."""
    lengths = {r: len(ids_by_row[r]) for r in rows}
    plan = batches(rows, lengths, batch_tokens, max_rows)
    total = sum(lengths.values())
    done = {"rows": 0, "tokens": 0}
    lock = threading.Lock()
    in_flight = threading.BoundedSemaphore(MAX_BATCHES_IN_FLIGHT)
    t0 = time.perf_counter()
    last_log = [t0]

    def write_batch(batch: list[int], host, event) -> None:
        try:
            if event is not None:
                event.synchronize()
            for b, r in enumerate(batch):
                n = lengths[r]
                _write_row(dest_dir / file_name(r), host[b, :n], ids_by_row[r], r, extractor)
                with lock:
                    done["rows"] += 1
                    done["tokens"] += n
        finally:
            in_flight.release()
        now = time.perf_counter()
        with lock:
            if now - last_log[0] >= 10 or done["rows"] == len(rows):
                last_log[0] = now
                rate = done["tokens"] / (now - t0)
                log.info("rows %d/%d, %d tokens, %.0f tokens/s, eta %.0f s", done["rows"], len(rows),
                         done["tokens"], rate, (total - done["tokens"]) / rate if rate else 0)

    futures: list[Future] = []
    with ThreadPoolExecutor(max_workers=writers) as pool:
        for batch in plan:
            in_flight.acquire()
            try:
                states = extractor.forward([ids_by_row[r] for r in batch])
                host, event = extractor.to_host(states)
                del states
            except BaseException:
                in_flight.release()
                raise
            futures.append(pool.submit(write_batch, batch, host, event))
            # Surface a writer's error (a failed validation) without waiting for the end.
            for f in [f for f in futures if f.done()]:
                f.result()
                futures.remove(f)
        for f in futures:
            f.result()
    return done["tokens"]


class TransformersBackend:
    name = "transformers"

    def extract(self, request: ExtractionRequest) -> Extracted:
        import torch

        device = "cuda" if has_cuda() else "cpu"
        engine = request.engine
        if device == "cpu" and engine.threads:
            torch.set_num_threads(int(engine.threads))
        t0 = time.perf_counter()
        batch_tokens = request.options.get("batch_tokens") or DEFAULT_BATCH_TOKENS
        # The job's GPUs (claim_gpus set CUDA_VISIBLE_DEVICES to them): all of them hold the target.
        gpus = torch.cuda.device_count() if device == "cuda" else 0
        placement = job_device_map(request.target_dir, engine.dtype, gpus, batch_tokens, engine.trust_remote_code)
        decoder = load_decoder(request.target_dir, engine.dtype, device, engine.trust_remote_code, placement=placement)
        load_s = time.perf_counter() - t0
        log.info("transformers decoder ready on %s in %.1f s", device, load_s)
        extractor = HFExtractor(decoder, request.extracted, request.hidden_size, engine.dtype, request.format)
        t1 = time.perf_counter()
        tokens = run_batches(
            extractor, request.rows, request.token_ids, request.dest,
            batch_tokens=batch_tokens, max_rows=request.rows_per_call,
        )
        return Extracted(tokens, load_s, time.perf_counter() - t1)


BACKEND = TransformersBackend()
