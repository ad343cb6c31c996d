"""The extraction stage in a fresh process, as a job runs it: the first call (cold: start-up,
imports, the target read) against further calls (warm) in the same process, after the target
was just saved, after `sync`, and with the page cache dropped. The child process is
`bench_cuda.py extract-calls`."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import ENTRY, log
from record_run import meminfo


def extract_calls_main() -> None:
    """A fresh process that does what scripts/hidden_states.py does (claim a GPU, then
    `extract_shard(backend="transformers")` with the pipeline's defaults) `--calls` times,
    each into a new folder, and writes the timings to `--result` (JSON). Each written row's
    time is recorded by wrapping `draftline.backends.transformers._write_row` (it still does
    the writing)."""
    t_main = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--target", type=Path)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--result", type=Path)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s calls %(name)s %(message)s")
    import draftline.backends.transformers as hf
    from draftline.runtime.devices import claim_gpus
    from draftline.runtime.shards import ShardJob
    from draftline.runtime.vllm_engine import EngineSettings
    from draftline.stages.hidden_states import ExtractionSettings, extract_shard

    t_imp = time.time()
    got = claim_gpus(1)
    t_claim = time.time()
    marks: list[tuple[float, int]] = []
    load_start: list[float] = []
    run_start: list[float] = []
    write_row, run_batches, load_decoder = hf._write_row, hf.run_batches, hf.load_decoder

    def timed_load_decoder(*args, **kw):
        load_start.append(time.perf_counter())
        return load_decoder(*args, **kw)

    def timed_write_row(*args, **kw):
        n = write_row(*args, **kw)
        marks.append((time.perf_counter(), n))
        return n

    def timed_run_batches(*args, **kw):
        run_start.append(time.perf_counter())
        return run_batches(*args, **kw)

    hf._write_row, hf.run_batches, hf.load_decoder = timed_write_row, timed_run_batches, timed_load_decoder
    layer_ids = a.work / "layer_ids.json"
    out = {"process_start_to_main_s": None, "imports_s": round(t_imp - t_main, 2), "claim_gpus_s": round(t_claim - t_imp, 2),
           "claimed": got, "t_main_epoch": t_main, "batch_tokens": hf.DEFAULT_BATCH_TOKENS,
           "max_batches_in_flight": hf.MAX_BATCHES_IN_FLIGHT, "calls": []}
    for call in range(1, a.calls + 1):
        import shutil

        marks.clear()
        load_start.clear()
        run_start.clear()
        dest = a.work / f"hs_call{call}" / "shard_0"
        mem = meminfo("Dirty", "Writeback", "Cached")
        t0 = time.perf_counter()
        m = extract_shard(a.work / "dataset", a.target, layer_ids, ShardJob(0, 1, dest), EngineSettings(dtype="auto", threads=8),
                          ExtractionSettings(backend="transformers", rows_per_call=64))
        wall = time.perf_counter() - t0
        rec = {"call": call, "wall_s": round(wall, 2), "tokens": m["tokens"], "rows": m["num_rows"],
               "load_seconds": m["load_seconds"], "extract_seconds": m["extract_seconds"],
               "tokens_per_s": m["tokens_per_s"], "tokens_per_wall_s": round(m["tokens"] / wall, 1),
               "bytes": m["bytes"], "gb_per_s_written": round(m["bytes"] / m["extract_seconds"] / 1e9, 3),
               # before the decoder load: imports (transformers, datasets, speculators on a first call),
               # opening the dataset, reading the target's config, checking staged files
               "before_load_s": round(load_start[0] - t0, 2),
               # after extraction: the shard's manifest, publishing (hard links), removing staging
               "after_extract_s": round(wall - (run_start[0] - t0) - m["extract_seconds"], 2),
               "first_row_written_s": round(min(t for t, _ in marks) - run_start[0], 2),
               "meminfo_at_start": mem}
        out["calls"].append(rec)
        log.info("call %d: %s", call, rec)
        shutil.rmtree(dest.parent)
        a.result.write_text(json.dumps(out, indent=1) + "\n")
    a.result.write_text(json.dumps(out, indent=1) + "\n")


def headline(work: Path, target: Path, calls: int = 2, drop_caches: bool = False, sync_first: bool = False) -> dict:
    """The pipeline's stage in a fresh process: first call (cold, start-up included), then
    further calls in the same process (warm). With `sync_first`, dirty pages (the target just
    saved) are written out first; with `drop_caches`, the page cache is also dropped (the target
    is read from disk)."""
    out: dict = {"meminfo_before": meminfo("Dirty", "Writeback", "Cached")}
    if sync_first and not drop_caches:
        t0 = time.perf_counter()
        subprocess.run(["sync"], check=False)
        out["sync_s"] = round(time.perf_counter() - t0, 2)
    if drop_caches:
        if not torch.cuda.is_available():  # only on the lent GPU machine, never on a shared one
            return {"page_cache_dropped": "no: not on a CUDA machine"}
        subprocess.run(["sync"], check=False)
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            out["page_cache_dropped"] = True
        except OSError as e:
            out["page_cache_dropped"] = f"no: {e}"
            return out
    res = work / f"calls_{calls}_{int(drop_caches)}_{int(sync_first)}.json"
    cmd = [sys.executable, ENTRY, "extract-calls", "--work", str(work), "--target", str(target),
           "--calls", str(calls), "--result", str(res)]
    t0 = time.time()
    subprocess.run(cmd, check=True)
    total = time.time() - t0
    r = json.loads(res.read_text())
    r["process_start_to_main_s"] = round(r.pop("t_main_epoch") - t0, 2)
    r["process_wall_s"] = round(total, 2)
    r["command"] = shlex.join(cmd)
    out.update(r)
    c = r["calls"]
    if len(c) >= 2:
        c1, c2 = c[0], c[1]
        extra = c1["wall_s"] - c2["wall_s"]
        fixed2 = c2["wall_s"] - c2["tokens"] / c2["tokens_per_s"]  # warm call's load, dataset, publish
        fixed1 = c1["wall_s"] - c1["tokens"] / c2["tokens_per_s"]  # everything in call 1 beyond the warm rate
        rate = c2["tokens_per_s"]
        # first call on N tokens: T1(N) = extra + fixed2 + N / rate; extra / T1(N) < 5% when:
        out["first_call_extra_s"] = round(extra, 2)
        out["warm_call_fixed_s"] = round(fixed2, 2)
        out["first_call_fixed_s"] = round(fixed1, 2)
        out["tokens_for_extra_under_5pct"] = round(max(0.0, rate * (19 * extra - fixed2)))
        # fixed1 / (fixed1 + N / rate) < 5% (a fresh job's whole fixed cost, load included):
        out["tokens_for_fixed_under_5pct"] = round(19 * fixed1 * rate)
    return out
