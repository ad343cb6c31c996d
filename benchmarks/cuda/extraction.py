"""Extraction's rate: `extract_shard(backend="transformers")` (what scripts/hidden_states.py calls)
against the compute limit and a plain decoder forward of the same batches, and the like-for-like
variants (`--only extraction`) that tell where its time goes."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from common import log, sync
from record_run import summarize


def extraction(work: Path, target: Path, batch_tokens: int, flops_per_token: float | None, tflops: float | None) -> dict:
    from draftline.runtime.shards import ShardJob
    from draftline.runtime.vllm_engine import EngineSettings
    from draftline.stages.hidden_states import ExtractionSettings, build_training_view, extract_shard

    t0 = time.perf_counter()
    m = extract_shard(work / "dataset", target, work / "layer_ids.json", ShardJob(0, 1, work / "hs" / "shard_0"),
                      EngineSettings(threads=8), ExtractionSettings(backend="transformers", options={"batch_tokens": batch_tokens}))
    wall = time.perf_counter() - t0
    build_training_view([work / "hs" / "shard_0"], work / "hs" / "all")
    out = {"manifest": {k: v for k, v in m.items() if k != "versions"}, "wall_s": round(wall, 1),
           "tokens_per_s": m["tokens_per_s"],
           "gb_per_s_written": round(m["bytes"] / m["extract_seconds"] / 1e9, 3),
           "bytes_per_token": round(m["bytes"] / m["tokens"], 1),
           "batch_tokens": batch_tokens}
    if tflops and flops_per_token:
        limit = tflops * 1e12 / flops_per_token
        out["compute_limit_tokens_per_s"] = round(limit, 1)
        out["fraction_of_compute_limit"] = round(m["tokens_per_s"] / limit, 3)
    return out


def plain_forward(work: Path, target: Path, batch_tokens: int, max_batches: int) -> dict:
    """Reference: the same decoder on the same batches, no capture, nothing written."""
    from datasets import load_from_disk

    from draftline.backends.transformers import batches, load_decoder

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if device == "cuda" else "float32"
    decoder = load_decoder(target, dtype, device)
    ds = load_from_disk(str(work / "dataset")).with_format(None)
    ids = ds["input_ids"]
    lengths = {r: len(x) for r, x in enumerate(ids)}
    plan = batches(list(lengths), lengths, batch_tokens, 64)[:max_batches]

    def run(batch):
        longest = max(lengths[r] for r in batch)
        x = torch.zeros((len(batch), longest), dtype=torch.long)
        mask = torch.zeros_like(x)
        for b, r in enumerate(batch):
            x[b, : lengths[r]] = torch.tensor(ids[r])
            mask[b, : lengths[r]] = 1
        with torch.inference_mode():
            decoder(input_ids=x.to(device), attention_mask=mask.to(device), use_cache=False)

    run(plan[0])  # warm-up
    sync()
    t0 = time.perf_counter()
    for batch in plan:
        run(batch)
    sync()
    s = time.perf_counter() - t0
    tokens = sum(lengths[r] for b in plan for r in b)
    padded = sum(max(lengths[r] for r in b) * len(b) for b in plan)
    decoder = None  # free the GPU memory (run() above holds the name)
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"batches": len(plan), "tokens": tokens, "padded_tokens": padded, "seconds": round(s, 2),
            "tokens_per_s": round(tokens / s, 1)}


class _HostOnlyExtractor:
    """Stands in for HFExtractor in `run_batches`: hands out host tensors of each batch's shape
    at once (zeros), so the stage's writer threads (save + validate) run alone."""

    def __init__(self, extracted: list[int], hidden: int, max_elems: int, dtype: str):
        self.extracted, self.hidden_size, self.dtype, self.cuda = extracted, hidden, dtype, False
        self.format = "full"  # hidden_states.format, as HFExtractor has it
        self.buf = torch.zeros(max_elems, dtype=getattr(torch, dtype))

    def forward(self, token_ids):
        shape = (len(token_ids), max(map(len, token_ids)), len(self.extracted), self.hidden_size)
        return self.buf[: shape[0] * shape[1] * shape[2] * shape[3]].view(shape)

    def to_host(self, states):
        return states, None


def extraction_variants(work: Path, target: Path, batch_tokens: int, rounds: int) -> dict:
    """Like-for-like variants, all warm, in one process, alternating, `rounds` times each:
    - stage_inflight4 / stage_inflight2: `extract_shard(backend="transformers")` with
      MAX_BATCHES_IN_FLIGHT 4 (the default) / 2;
    - plain_forward: the same decoder on the same batches (all of them), no capture, nothing kept;
    - capture_copy: HFExtractor.forward (output_hidden_states, stack) + the copy to pinned
      host memory, nothing written;
    - writers_only: the stage's `run_batches` with host tensors handed out at once (no GPU):
      save + validate of the same files by the same 4 writer threads, no fsync (as the stage).
    One untimed extract_shard call first, so no variant pays this process's first call."""
    import shutil

    from datasets import load_from_disk

    import draftline.backends.transformers as hf
    from draftline.artifacts import layer_ids as layer_ids_file
    from draftline.runtime.shards import ShardJob
    from draftline.runtime.vllm_engine import EngineSettings
    from draftline.stages.hidden_states import ExtractionSettings, extract_shard

    layer_ids = layer_ids_file.read(work / "layer_ids.json")
    ids = load_from_disk(str(work / "dataset")).with_format(None)["input_ids"]
    lengths = {r: len(x) for r, x in enumerate(ids)}
    ids_by_row = dict(enumerate(ids))
    plan = hf.batches(list(lengths), lengths, batch_tokens, 64)
    tokens = sum(lengths.values())
    padded = sum(len(b) * max(lengths[r] for r in b) for b in plan)
    default_inflight = hf.MAX_BATCHES_IN_FLIGHT
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if device == "cuda" else "float32"  # what dtype "auto" resolves to

    def stage(inflight):
        hf.MAX_BATCHES_IN_FLIGHT = inflight
        try:
            d = work / "hs_var" / "shard_0"
            t0 = time.perf_counter()
            m = extract_shard(work / "dataset", target, layer_ids, ShardJob(0, 1, d), EngineSettings(dtype="auto", threads=8),
                              ExtractionSettings(backend="transformers", rows_per_call=64, options={"batch_tokens": batch_tokens}))
            wall = time.perf_counter() - t0
            shutil.rmtree(d.parent)
        finally:
            hf.MAX_BATCHES_IN_FLIGHT = default_inflight
        return {"tokens_per_s": m["tokens_per_s"], "wall_s": round(wall, 2), "load_s": m["load_seconds"],
                "gb_per_s_written": round(m["bytes"] / m["extract_seconds"] / 1e9, 3)}

    warmup = stage(default_inflight)
    plain_decoder = hf.load_decoder(target, dtype, device)
    cap_decoder = hf.load_decoder(target, dtype, device)
    ex = hf.HFExtractor(cap_decoder, layer_ids.extracted, cap_decoder.config.hidden_size, dtype)

    def plain_batch(batch):
        x, mask = hf.pad_batch([ids[r] for r in batch])
        with torch.inference_mode():
            plain_decoder(input_ids=x.to(device), attention_mask=mask.to(device), use_cache=False)

    def plain():
        sync()
        t0 = time.perf_counter()
        for b in plan:
            plain_batch(b)
        sync()
        return {"tokens_per_s": round(tokens / (time.perf_counter() - t0), 1)}

    def capture():
        sync()
        t0 = time.perf_counter()
        event = None
        for b in plan:
            host, event = ex.to_host(ex.forward([ids[r] for r in b]))
        if event is not None:
            event.synchronize()
        return {"tokens_per_s": round(tokens / (time.perf_counter() - t0), 1)}

    fake = _HostOnlyExtractor(layer_ids.extracted, cap_decoder.config.hidden_size,
                              max(len(b) * max(lengths[r] for r in b) for b in plan)
                              * len(layer_ids.extracted) * cap_decoder.config.hidden_size, dtype)

    def writers():
        d = work / "hs_writers"
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        n = hf.run_batches(fake, list(lengths), ids_by_row, d, batch_tokens=batch_tokens, max_rows=64)
        s = time.perf_counter() - t0
        nbytes = sum(f.stat().st_size for f in d.iterdir())
        shutil.rmtree(d)
        return {"tokens_per_s": round(n / s, 1), "gb_per_s_written": round(nbytes / s / 1e9, 3)}

    # warm-ups of the in-process variants (first batch each)
    plain_batch(plan[0])
    capture_first = ex.to_host(ex.forward([ids[r] for r in plan[0]]))[1]
    if capture_first is not None:
        capture_first.synchronize()
    sync()
    variants = {"stage_inflight4": lambda: stage(4), "stage_inflight2": lambda: stage(2),
                "plain_forward": plain, "capture_copy": capture, "writers_only": writers}
    names = list(variants)
    runs: dict[str, list[dict]] = {k: [] for k in names}
    order = []
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:  # rotated each round
            log.info("variant %s, round %d", k, r + 1)
            runs[k].append(variants[k]())
            order.append(k)
    plain_decoder = cap_decoder = ex = fake = None  # free the GPU memory (closures above hold the names)
    if device == "cuda":
        torch.cuda.empty_cache()
    summary = {}
    for k, rs in runs.items():
        sm = summarize([x["tokens_per_s"] for x in rs])
        if "gb_per_s_written" in rs[0]:
            sm["gb_per_s_written"] = summarize([x["gb_per_s_written"] for x in rs])
        summary[k] = sm
    return {"rounds": rounds, "order": order, "batches": len(plan), "tokens": tokens, "padded_tokens": padded,
            "batch_tokens": batch_tokens, "warmup_call": warmup, "runs": runs, "summary": summary}
