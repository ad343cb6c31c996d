"""The pipeline's CUDA path, measured in one run (issues 8 and 7).

    PYTHONPATH=src python3 benchmarks/cuda/bench_cuda.py --out OUT --work /tmp/bench [--size 8b]

Builds a target with random weights (Llama-3.1-8B shape, bf16) and a dataset of random token
rows of realistic length, then runs the pipeline's own code on them:
- extraction: `draftline.hidden_states.extract_shard(backend="transformers")` (what
  scripts/hidden_states.py calls), against the compute limit (the decoder's useful FLOPs per
  token, `decoder_work`, at the bf16 matmul rate measured here) and against a plain decoder
  forward of the same batches. `--only extraction` runs just that, in depth: the stage in a
  fresh process (first call cold, second call warm), like-for-like variants alternating in one
  process (`extraction_variants`), the matmul rate three times, a page-cache-cold first call;
- training: `draftline.train.train` (what scripts/train.py calls: speculators' Trainer under
  torchrun), against a plain forward+backward loop of the same draft on the Trainer's own batch;
  peak GPU memory from nvidia-smi for both; the checkpoint is loaded back with speculators;
- with 2 GPUs (issue 7): training with 2 processes (DDP, then --fsdp-shard) against 1, and
  two extraction shards at once on distinct GPUs (CUDA_VISIBLE_DEVICES) against the same
  shards run one after the other.
Each stage appends its figures to OUT/results.json (rewritten after every stage, so a run cut
short keeps what it measured) and OUT/results.md is written at the end. `--size tiny` runs the
same code on a toy target (on CPU when there is no GPU) to check the script.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shlex
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

log = logging.getLogger("bench")

SIZES = {
    # Llama-3.1-8B's shape (rope scaling left out: it does not change the cost).
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
               rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=2048, max_position_embeddings=4096,
                 rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
}


# ---------------------------------------------------------------- helpers


class Results:
    def __init__(self, out: Path, meta: dict):
        self.out = out
        self.data = {"meta": meta, "stages": {}, "errors": {}}

    def put(self, stage: str, value: dict) -> None:
        self.data["stages"][stage] = value
        self.save()

    def error(self, stage: str, err: BaseException) -> None:
        self.data["errors"][stage] = "".join(traceback.format_exception(err))[-4000:]
        log.error("stage %s failed: %s", stage, err)
        self.save()

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.data, indent=1, default=str) + "\n")


class GpuMemoryPoller:
    """Peak `memory.used` per GPU (MiB) from nvidia-smi, sampled every 0.25 s."""

    def __init__(self):
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=5,
                ).stdout
                for line in out.strip().splitlines():
                    i, used = (int(x) for x in line.split(","))
                    self.peak[i] = max(self.peak.get(i, 0), used)
            except Exception:  # noqa: BLE001 - no nvidia-smi on CPU
                return
            self._stop.wait(0.25)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "speculators", "safetensors", "datasets", "hs-connectors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    out["cuda"] = torch.version.cuda
    return out


def gpu_info() -> dict:
    if not torch.cuda.is_available():
        return {"device": "cpu"}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    return {"device": "cuda", "count": torch.cuda.device_count(), "nvidia_smi": smi,
            "name": torch.cuda.get_device_name(0),
            "sms": torch.cuda.get_device_properties(0).multi_processor_count}


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except Exception:  # noqa: BLE001 - no git (the device machine gets a copy of the tree)
        return None


def host_info() -> dict:
    """CPU count, memory and the dirty-page limits (the stage never syncs: its files go to the
    page cache first)."""
    out: dict = {"cpus": os.cpu_count()}
    for name in ("dirty_ratio", "dirty_background_ratio", "dirty_bytes"):
        try:
            out[f"vm.{name}"] = Path(f"/proc/sys/vm/{name}").read_text().strip()
        except OSError:
            pass
    try:
        out["MemTotal"] = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split(":")[1].strip()
    except (OSError, StopIteration):
        pass
    return out


# ---------------------------------------------------------------- stages


def matmul_rate(size: str, warmup: int = 3, iters: int = 10) -> dict:
    """bf16 matmul TFLOP/s on random data (mean of `iters` after `warmup` products), the compute reference."""
    if not torch.cuda.is_available():
        return {"tflops": None, "note": "no CUDA"}
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    sync()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    sync()
    s = start.elapsed_time(end) / 1000 / iters
    del a, b
    torch.cuda.empty_cache()
    return {"n": n, "warmup": warmup, "iters": iters, "tflops": round(2 * n**3 / s / 1e12, 1)}


def build_target(folder: Path, size: str) -> dict:
    """A Llama target with random bf16 weights, saved as a Hugging Face folder (no tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    config = LlamaConfig(**SIZES[size], bos_token_id=1, eos_token_id=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    params = sum(p.numel() for p in model.parameters())
    embed = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    # The weights extraction multiplies by: the decoder layers' linear layers (no embedding
    # lookup, no lm_head; norms are elementwise).
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    build_s = time.perf_counter() - t0
    model.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"params": params, "params_without_embeddings_and_head": params - embed,
            "decoder_linear_params": linear, "dtype": str(dtype),
            "config": SIZES[size], "build_s": round(build_s, 1), "save_s": round(time.perf_counter() - t0 - build_s, 1),
            "bytes": sum(f.stat().st_size for f in folder.glob("*.safetensors"))}


def build_data(work: Path, target: Path, rows: int, seq_len: int, draft_vocab: int, vocab: int) -> dict:
    """Tokenized dataset (speculators' columns), layer ids, vocab maps, speculator config."""
    import numpy as np
    from datasets import Dataset

    from draftline.artifacts import layer_ids as layer_ids_file
    from draftline.layers import resolve_layer_ids
    from draftline.speculator_config import write_speculator_config
    from draftline.vocab import build_vocab_maps

    rng = random.Random(0)
    lengths = [rng.randint(seq_len * 3 // 4, seq_len * 5 // 4) for _ in range(rows)]
    # Zipf-like token ids, so the draft vocab covers most tokens as with real text.
    weights = [1 / (i + 10) for i in range(vocab)]
    ids = [rng.choices(range(vocab), weights=weights, k=n) for n in lengths]
    # Loss on the second half of each row: the "assistant" part.
    masks = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": masks, "seq_len": lengths})
    ds.set_format(type="torch")
    ds.save_to_disk(str(work / "dataset"))
    freq: dict[int, int] = {}
    for row in ids:
        for t in row:
            freq[t] = freq.get(t, 0) + 1
    d2t, t2d = build_vocab_maps(freq, draft_vocab, vocab)
    np.save(work / "d2t.npy", d2t)
    np.save(work / "t2d.npy", t2d)
    ids_ = resolve_layer_ids("auto", str(target))
    layer_ids_file.write(work / "layer_ids.json", ids_)
    write_speculator_config(work / "config", target, work / "layer_ids.json", draft_vocab)
    return {"rows": rows, "tokens": sum(lengths), "min_len": min(lengths), "max_len": max(lengths),
            "layer_ids": ids_.extracted, "draft_vocab": draft_vocab, "lengths": lengths}


def decoder_work(size: str, lengths: list[int], linear_params: int | None = None) -> dict:
    """Useful FLOPs per token of the decoder forward that extraction runs, for these rows.

    F = 2 * P_lin + 4 * L * d * sum_r(s_r * (s_r + 1) / 2) / sum_r(s_r)

    P_lin: weights of the decoder layers' linear layers (q, k, v, o, gate, up, down; the
    embedding lookup and lm_head are not run, norms and activations are elementwise and left
    out). Attention, causal, per layer and per head group: the token at position i scores and
    mixes i + 1 keys, 2 * d * (i + 1) FLOPs for Q K^T and as many for P V, with d = heads x
    head_dim; summed over a row of length s that is 4 * d * s (s + 1) / 2. Padding is not work.
    """
    c = SIZES[size]
    d, L = c["hidden_size"], c["num_hidden_layers"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * c["intermediate_size"]
    p_lin = L * per_layer
    if linear_params is not None and linear_params != p_lin:
        raise RuntimeError(f"decoder linear params {linear_params} != {p_lin} from the config")
    tokens = sum(lengths)
    causal_pairs = sum(s * (s + 1) // 2 for s in lengths)
    attn = 4 * L * d * causal_pairs / tokens
    return {
        "formula": "F = 2*P_lin + 4*L*d*sum_r(s_r*(s_r+1)/2)/sum_r(s_r)",
        "P_lin": p_lin, "L": L, "d": d, "rows": len(lengths), "tokens": tokens,
        "sum_causal_pairs": causal_pairs, "mean_row_len": round(tokens / len(lengths), 1),
        "token_weighted_mean_row_len": round(sum(s * s for s in lengths) / tokens, 1),
        "linear_flops_per_token": 2 * p_lin, "attention_flops_per_token": round(attn),
        "flops_per_token": round(2 * p_lin + attn),
    }


def extraction(work: Path, target: Path, batch_tokens: int, flops_per_token: float | None, tflops: float | None) -> dict:
    from draftline.engine import EngineSettings
    from draftline.hidden_states import build_training_view, extract_shard

    t0 = time.perf_counter()
    m = extract_shard(work / "dataset", target, work / "layer_ids.json", 0, 1, work / "hs" / "shard_0",
                      EngineSettings(threads=8), backend="transformers", options={"batch_tokens": batch_tokens})
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
    del decoder
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"batches": len(plan), "tokens": tokens, "padded_tokens": padded, "seconds": round(s, 2),
            "tokens_per_s": round(tokens / s, 1)}


def _summ(vals: list[float]) -> dict:
    v = sorted(vals)
    return {"n": len(v), "min": v[0],
            "median": v[len(v) // 2] if len(v) % 2 else round((v[len(v) // 2 - 1] + v[len(v) // 2]) / 2, 3),
            "max": v[-1], "all": vals}


def _meminfo(*keys: str) -> dict:
    try:
        rows = dict(x.split(":", 1) for x in Path("/proc/meminfo").read_text().splitlines())
        return {k: rows[k].strip() for k in keys if k in rows}
    except OSError:
        return {}


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
    from draftline.devices import claim_gpus
    from draftline.engine import EngineSettings
    from draftline.hidden_states import extract_shard

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
        mem = _meminfo("Dirty", "Writeback", "Cached")
        t0 = time.perf_counter()
        m = extract_shard(a.work / "dataset", a.target, layer_ids, 0, 1, dest,
                          EngineSettings(dtype="auto", threads=8), backend="transformers", rows_per_call=64)
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
    out: dict = {"meminfo_before": _meminfo("Dirty", "Writeback", "Cached")}
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
    cmd = [sys.executable, __file__, "extract-calls", "--work", str(work), "--target", str(target),
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


class _HostOnlyExtractor:
    """Stands in for HFExtractor in `run_batches`: hands out host tensors of each batch's shape
    at once (zeros), so the stage's writer threads (save + validate) run alone."""

    def __init__(self, extracted: list[int], hidden: int, max_elems: int, dtype: str):
        self.extracted, self.hidden_size, self.dtype, self.cuda = extracted, hidden, dtype, False
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
    from draftline.engine import EngineSettings
    from draftline.hidden_states import extract_shard

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
            m = extract_shard(work / "dataset", target, layer_ids, 0, 1, d, EngineSettings(dtype="auto", threads=8),
                              backend="transformers", rows_per_call=64, options={"batch_tokens": batch_tokens})
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
    del plain_decoder, cap_decoder, ex, fake
    if device == "cuda":
        torch.cuda.empty_cache()
    summary = {}
    for k, rs in runs.items():
        sm = _summ([x["tokens_per_s"] for x in rs])
        if "gb_per_s_written" in rs[0]:
            sm["gb_per_s_written"] = _summ([x["gb_per_s_written"] for x in rs])
        summary[k] = sm
    return {"rounds": rounds, "order": order, "batches": len(plan), "tokens": tokens, "padded_tokens": padded,
            "batch_tokens": batch_tokens, "warmup_call": warmup, "runs": runs, "summary": summary}


def train_inputs(work: Path, target: Path):
    from draftline.train import TrainInputs

    return TrainInputs(config_dir=work / "config", dataset=work / "dataset", hidden_states=work / "hs" / "all",
                       d2t=work / "d2t.npy", t2d=work / "t2d.npy", layer_ids=work / "layer_ids.json",
                       target=str(target))


def training(work: Path, target: Path, name: str, gpus: int, epochs: int, total_seq_len: int,
             fsdp: bool = False, num_workers: int | str = "auto") -> dict:
    """`draftline.train.train` as scripts/train.py calls it, with the `train.fsdp` and
    `train.num_workers` settings."""
    import draftline.train as dt
    from draftline.artifacts import metrics

    settings = dt.TrainSettings(epochs=epochs, total_seq_len=total_seq_len, train_fraction=0.9,
                                fsdp=fsdp, num_workers=num_workers)
    t0 = time.perf_counter()
    with GpuMemoryPoller() as mem:
        final = dt.train(train_inputs(work, target), settings,
                         dt.TrainJob(work / name / "runs", work / name / "final", threads=4, gpus=gpus))
    wall = time.perf_counter() - t0
    prov = json.loads((final / "draftline_provenance.json").read_text())
    run_dir = Path(prov["run_dir"])
    profiles = [r["profile"] for r in metrics.records(run_dir / "metrics.jsonl") if "profile" in r]
    steady = profiles[len(profiles) // 4:] or profiles  # without the first steps (start-up)

    def med(key):
        vals = sorted(p.get(key, 0.0) for p in steady)
        return round(vals[len(vals) // 2], 2) if vals else None

    world = prov["world_size"]
    mem_marks = [v for p in profiles for v in (p.get("memory_mb") or {}).values()]
    return {
        "gpus": gpus, "world_size": world, "fsdp_shard": fsdp, "device": prov["device"],
        "num_workers": prov["num_workers"],
        "optimizer": prov["optimizer"], "epochs": epochs, "total_seq_len": total_seq_len,
        "wall_s": round(wall, 1), "steps_logged_rank0": len(profiles),
        "throughput_rank0": prov["throughput"],
        "median_step_tokens_per_s_rank0": med("tokens_per_s"),
        # Every rank runs the same number of equally packed steps: the job's rate is world x rank 0's.
        "median_tokens_per_s_all_ranks": round(med("tokens_per_s") * world, 1) if med("tokens_per_s") else None,
        "median_ms": {k: med(k) for k in ("step_ms", "fwd_ms", "bwd_ms", "opt_ms", "fetch_ms", "h2d_ms")},
        "peak_memory_allocated_at_marks_mib_rank0": round(max(mem_marks), 1) if mem_marks else None,
        "peak_nvidia_smi_mib": mem.peak,
        "val_loss_per_epoch": prov["val_loss_per_epoch"],
        "final": str(final), "final_files": sorted(p.name for p in final.iterdir()),
        "train_command": (final / "train_command.txt").read_text()[:2000] if (final / "train_command.txt").exists() else None,
    }


def checkpoint_check(final: Path) -> dict:
    """Load the checkpoint with speculators; record its tensors (names, shapes, dtypes)."""
    from safetensors import safe_open
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(str(final))
    with safe_open(str(final / "model.safetensors"), framework="pt") as f:
        tensors = {k: [list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()] for k in f.keys()}  # noqa: SIM118
    cfg = json.loads((final / "config.json").read_text())
    return {"loaded_class": type(model).__name__, "params": sum(p.numel() for p in model.parameters()),
            "tensors": tensors, "config_keys": sorted(cfg), "speculators_model_type": cfg.get("speculators_model_type")}


def reference_fwd_bwd(work: Path, target: Path, total_seq_len: int, steps: int) -> dict:
    """Plain forward+backward of the same draft, on the Trainer's own first batch, in a loop."""
    import speculators.train.cli as cli
    from hs_connectors import HiddenStatesBackend
    from speculators.models.eagle3.data import shift_batch
    from speculators.model import SpeculatorModel
    from speculators.train.config import TrainConfig
    from speculators.train.dataloader import create_train_val_loaders

    import draftline.train as dt

    if not torch.cuda.is_available():
        from draftline.train_entry import apply_cpu_shims

        apply_cpu_shims()
    settings = dt.TrainSettings(epochs=1, total_seq_len=total_seq_len, train_fraction=0.9)
    inputs = train_inputs(work, target)
    facts = dt.check_inputs(inputs)
    argv = dt.speculators_args(inputs, settings, facts, dt.TrainerOptions(optimizer="adamw"), work / "ref_run")
    args = argparse.Namespace(**TrainConfig.resolve(argv).flatten())
    cls = SpeculatorModel.registry["eagle3"]
    d2t, t2d, dvs = cli.parse_vocab_mappings(args)
    model = cli.build_draft_model(args, cls, t2d, d2t, dvs)
    hs_dtype = getattr(torch, args.hidden_states_dtype)
    transfer = HiddenStatesBackend.registry[args.hidden_states_backend].from_train_args(args, args.data_path)
    loader, _ = create_train_val_loaders(
        data_path=args.data_path, total_seq_len=args.total_seq_len, hidden_states_dtype=hs_dtype,
        transfer=transfer, vllm_endpoint=args.vllm_endpoint, on_missing=args.on_missing,
        verifier_name_or_path=args.verifier_name_or_path, request_timeout=args.request_timeout,
        max_retries=args.max_retries, generation_validation_retries=args.generation_validation_retries,
        max_consecutive_generation_failures=args.max_consecutive_generation_failures,
        hidden_size=model.config.transformer_layer_config.hidden_size,
        num_target_layers=len(model.target_layer_ids), num_workers=0, prefetch_factor=args.prefetch_factor,
        preprocess=shift_batch, train_data_ratio=args.train_data_ratio, seed=args.seed,
    )  # fmt: skip
    kwargs, _ = cls.get_trainer_kwargs(**vars(args))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).train()
    batch = next(iter(loader))
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    batch.pop("error_records", None)
    tokens = int((batch["document_ids"] != -1).sum())
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast(device, dtype=hs_dtype):
            _, loss, _ = model(**batch, **(kwargs or {}))
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    sync()
    with GpuMemoryPoller() as mem:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        s = time.perf_counter() - t0
    out = {"steps": steps, "tokens_per_step": tokens, "ms_per_step": round(1000 * s / steps, 2),
           "tokens_per_s": round(tokens * steps / s, 1), "peak_nvidia_smi_mib": mem.peak}
    if device == "cuda":
        out["max_memory_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        out["max_memory_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def shard_cmd(work: Path, target: Path, out_dir: Path, shard: int, n: int, batch_tokens: int) -> list[str]:
    return [sys.executable, __file__, "extract-shard", "--work", str(work), "--target", str(target),
            "--out-dir", str(out_dir), "--shard", str(shard), "--num-shards", str(n),
            "--batch-tokens", str(batch_tokens)]


def parallel_shards(work: Path, target: Path, batch_tokens: int) -> dict:
    """Shards 0 and 1 of 2: one after the other on GPU 0, then at once, each job taking a free
    GPU through the scripts' local device assignment (`draftline.devices.claim_gpus(1)`)."""
    from safetensors.torch import load_file

    env_seq = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    env_par = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    t0 = time.perf_counter()
    for k in (0, 1):
        subprocess.run(shard_cmd(work, target, work / "seq" / f"shard_{k}", k, 2, batch_tokens), env=env_seq, check=True)
    seq_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    procs = [subprocess.Popen(shard_cmd(work, target, work / "par" / f"shard_{k}", k, 2, batch_tokens), env=env_par)
             for k in (0, 1)]
    codes = [p.wait() for p in procs]
    par_s = time.perf_counter() - t0
    if any(codes):
        raise RuntimeError(f"parallel shard processes exited with {codes}")
    identical, differ, max_diff_vs_one_shard = 0, [], 0.0
    manifests = {}
    for k in (0, 1):
        ms = json.loads((work / "seq" / f"shard_{k}" / "manifest.json").read_text())
        mp = json.loads((work / "par" / f"shard_{k}" / "manifest.json").read_text())
        manifests[k] = {"seq_tokens_per_s": ms["tokens_per_s"], "par_tokens_per_s": mp["tokens_per_s"],
                        "rows": [ms["row_start"], ms["row_stop"]], "tokens": ms["tokens"]}
        for r in range(ms["row_start"], ms["row_stop"]):
            a = load_file(work / "seq" / f"shard_{k}" / f"hs_{r}.safetensors")
            b = load_file(work / "par" / f"shard_{k}" / f"hs_{r}.safetensors")
            if all(torch.equal(a[x], b[x]) for x in ("hidden_states", "token_ids")):
                identical += 1
            else:
                differ.append(r)
            one = load_file(work / "hs" / "shard_0" / f"hs_{r}.safetensors")["hidden_states"]
            max_diff_vs_one_shard = max(max_diff_vs_one_shard, (one.float() - a["hidden_states"].float()).abs().max().item())
    claimed = {k: (work / "par" / f"claimed_{k}.txt").read_text() for k in (0, 1)}
    return {"sequential_s": round(seq_s, 1), "parallel_s": round(par_s, 1), "parallel_devices": claimed, "speedup": round(seq_s / par_s, 2),
            "rows_identical": identical, "rows_differing": differ, "shards": manifests,
            "max_abs_diff_vs_single_shard_run": max_diff_vs_one_shard,
            "commands": [shlex.join(shard_cmd(work, target, work / "par" / f"shard_{k}", k, 2, batch_tokens))
                         for k in (0, 1)]}


# ---------------------------------------------------------------- report


def markdown(data: dict) -> str:
    m, s = data["meta"], data["stages"]
    lines = [f"# CUDA benchmark ({m['size']})", "", f"- command: `{m['command']}`", f"- GPU: {m['gpu']}",
             f"- versions: {m['versions']}", f"- started: {m['started']}, finished: {m.get('finished')}",
             f"- commit: {m.get('commit')}; host: {m.get('host')}", ""]
    if "matmul" in s:
        lines.append(f"bf16 matmul 8192^3: **{s['matmul']['tflops']} TFLOP/s** (measured in this run)\n")
    if "target" in s:
        t = s["target"]
        lines.append(f"Target: random Llama, {t['params'] / 1e9:.2f} B params ({t['dtype']}), built in "
                     f"{t['build_s']} s, saved in {t['save_s']} s. Data: "
                     f"{ {k: v for k, v in s.get('data', {}).items() if k != 'lengths'} }\n")
    if "extraction" in s:
        e = s["extraction"]
        ref = s.get("plain_forward", {})
        lines += ["## Extraction (transformers backend, `extract_shard`)", "", "| figure | value | reference |",
                  "|---|---|---|",
                  f"| tokens/s | {e['tokens_per_s']} | compute limit {e.get('compute_limit_tokens_per_s')} "
                  f"(= {e.get('fraction_of_compute_limit')} of it); plain decoder forward {ref.get('tokens_per_s')} |",
                  f"| GB/s written | {e['gb_per_s_written']} | |",
                  f"| bytes/token | {e['bytes_per_token']} | |",
                  f"| engine load s | {e['manifest']['load_seconds']} | |", ""]
    for key in ("train_1gpu", "train_1gpu_workers0", "train_ddp2", "train_fsdp2"):
        if key in s:
            t = s[key]
            lines += [f"## Training `{key}`", "", f"- median step tokens/s (all ranks): **{t['median_tokens_per_s_all_ranks']}**"
                      f" (rank 0: {t['median_step_tokens_per_s_rank0']}); median ms {t['median_ms']}",
                      f"- peak GPU memory (nvidia-smi, MiB): {t['peak_nvidia_smi_mib']}; allocated at step marks "
                      f"(rank 0): {t['peak_memory_allocated_at_marks_mib_rank0']}",
                      f"- wall {t['wall_s']} s (start-up included), optimizer {t['optimizer']}, loader workers "
                      f"{t.get('num_workers')}, val loss {t['val_loss_per_epoch']}", ""]
    if "reference_fwd_bwd" in s:
        r = s["reference_fwd_bwd"]
        lines += ["## Reference: plain forward+backward of the same draft", "", f"- {r}", ""]
    if "train_1gpu" in s and "reference_fwd_bwd" in s:
        t1 = s["train_1gpu"]["median_tokens_per_s_all_ranks"]
        lines.append(f"Trainer / plain fwd+bwd: {t1 / s['reference_fwd_bwd']['tokens_per_s']:.2f}\n")
    for key in ("train_ddp2", "train_fsdp2"):
        if key in s and "train_1gpu" in s:
            eff = s[key]["median_tokens_per_s_all_ranks"] / (2 * s["train_1gpu"]["median_tokens_per_s_all_ranks"])
            lines.append(f"Scaling efficiency {key} vs 1 GPU: **{eff:.2f}**\n")
    if "train_1gpu" in s and "train_1gpu_workers0" in s:
        w, w0 = s["train_1gpu"], s["train_1gpu_workers0"]
        ratio = w["median_tokens_per_s_all_ranks"] / w0["median_tokens_per_s_all_ranks"]
        lines.append(f"Loader workers {w.get('num_workers')} vs 0 (1 GPU, median step tokens/s): **x{ratio:.2f}**; "
                     f"median fetch ms {w['median_ms'].get('fetch_ms')} vs {w0['median_ms'].get('fetch_ms')}\n")
    if "parallel_shards" in s:
        lines += ["## Two extraction shards at once (CUDA_VISIBLE_DEVICES=0 / 1)", "", f"- {s['parallel_shards']}", ""]
    for key in ("checkpoint", "checkpoint_ddp", "checkpoint_fsdp"):
        if key in s:
            c = s[key]
            lines += [f"## {key}", "", f"- loads with speculators as {c['loaded_class']} ({c['params']} params); "
                      f"tensors {c['tensors']}", ""]
    lines += markdown_extraction(s)
    if data["errors"]:
        lines += ["## Errors", ""] + [f"### {k}\n```\n{v}\n```" for k, v in data["errors"].items()]
    return "\n".join(lines) + "\n"


def markdown_extraction(s: dict) -> list[str]:
    """The `--only extraction` stages: the stage's first and second call, the limit, the variants."""
    lines: list[str] = []
    w, lim = s.get("decoder_work"), s.get("compute_limit", {}).get("tokens_per_s")
    if w:
        lines += ["## Decoder work per token (useful FLOPs, these rows)", "",
                  f"`{w['formula']}` with P_lin = {w['P_lin']:,} (decoder layers' linear weights), L = {w['L']}, "
                  f"d = {w['d']}, {w['rows']} rows, {w['tokens']:,} tokens, sum_r s_r(s_r+1)/2 = {w['sum_causal_pairs']:,} "
                  f"(mean row {w['mean_row_len']}, token-weighted mean {w['token_weighted_mean_row_len']}): "
                  f"{w['linear_flops_per_token'] / 1e9:.3f} + {w['attention_flops_per_token'] / 1e9:.3f} = "
                  f"**{w['flops_per_token'] / 1e9:.3f} GFLOP/token**", ""]
    if "compute_limit" in s:
        c = s["compute_limit"]
        lines += [f"bf16 matmul 8192^3, highest of each reading (start, between, end of the call): "
                  f"{c['matmul_tflops_measured']} TFLOP/s; limit = {c['matmul_tflops_used']} TFLOP/s / F = "
                  f"**{c['tokens_per_s']:,.0f} tokens/s**", ""]
    for k in ("matmul", "matmul_mid", "matmul_end"):
        if "tflops_by_warmup_and_timed_products" in s.get(k, {}):
            lines.append(f"- {k}: TFLOP/s by (warm-up + timed products): {s[k]['tflops_by_warmup_and_timed_products']}")
    lines.append("")

    def frac(x):
        return f" ({x / lim:.2f} of the limit)" if lim and x else ""

    titles = {"headline": "right after the target was saved",
              "headline_synced": "after `sync` (the target's pages written out)",
              "headline_disk_cold": "page cache dropped (the target read from disk)"}
    for key, title in titles.items():
        if key not in s:
            continue
        h = s[key]
        if not h.get("calls"):
            lines += [f"## The stage, fresh process, {title}: not run ({h.get('page_cache_dropped')})", ""]
            continue
        lines += [f"## The pipeline's stage in a fresh process, {title}", "",
                  f"`extract_shard(backend=\"transformers\")` as scripts/hidden_states.py calls it; process start "
                  f"to main {h['process_start_to_main_s']} s (python, torch), claim_gpus {h['claim_gpus_s']} s, "
                  f"process wall {h['process_wall_s']} s" + (f", sync before it {h['sync_s']} s" if "sync_s" in h else ""),
                  "", "| call | wall s | before load s | load s | extract s | after s | tokens/s (manifest) "
                  "| tokens / wall s | first row written s | GB/s written | Dirty at start |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in h["calls"]:
            lines.append(f"| {c['call']} | {c['wall_s']} | {c.get('before_load_s')} | {c['load_seconds']} | "
                         f"{c['extract_seconds']} | {c.get('after_extract_s')} | "
                         f"**{c['tokens_per_s']:,.0f}**{frac(c['tokens_per_s'])} | {c['tokens_per_wall_s']:,.0f} | "
                         f"{c.get('first_row_written_s')} | {c['gb_per_s_written']} | "
                         f"{c.get('meminfo_at_start', {}).get('Dirty')} |")
        if "first_call_extra_s" in h:
            lines += ["", f"- {h['calls'][0]['tokens']:,} tokens per call; first call's extra over the second: "
                          f"{h['first_call_extra_s']} s; its share of a first call falls under 5% from "
                          f"**{h['tokens_for_extra_under_5pct']:,} tokens** per shard",
                      f"- a fresh job's whole fixed cost (call 1 minus its tokens at the second call's rate; load "
                      f"included): {h['first_call_fixed_s']} s; under 5% from {h['tokens_for_fixed_under_5pct']:,} tokens"]
        lines.append("")
    if "extraction_variants" in s:
        v = s["extraction_variants"]
        lines += ["## Like-for-like variants (one process, warm, alternating)", "",
                  f"{v['rounds']} rounds, {v['batches']} batches of <= {v['batch_tokens']} padded tokens, {v['tokens']:,} "
                  f"tokens ({v['padded_tokens']:,} padded); order: {', '.join(v['order'])}", "",
                  "| variant | tokens/s min | median | max | median / limit | GB/s written (median) |", "|---|---|---|---|---|---|"]
        for k, m in v["summary"].items():
            gb = m.get("gb_per_s_written", {}).get("median", "")
            lines.append(f"| {k} | {m['min']:,.0f} | **{m['median']:,.0f}** | {m['max']:,.0f} | "
                         f"{m['median'] / lim if lim else 0:.2f} | {gb} |")
        lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="8b")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--total-seq-len", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--stages", default="matmul,target,data,extraction,plain_forward,train_1gpu,checkpoint,"
                                        "extraction_variants,reference_fwd_bwd,train_ddp2,checkpoint_ddp,parallel_shards,"
                                        "train_fsdp2,checkpoint_fsdp")
    ap.add_argument("--only", choices=["extraction"], help="extraction: the stage in a fresh process (first "
                    "and second call), the like-for-like variants, the matmul rate before, between and after, "
                    "and a first call with the page cache dropped (overrides --stages)")
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of each extraction variant")
    a = ap.parse_args()
    if a.only == "extraction":
        a.stages = "matmul,target,data,headline,headline_synced,headline_disk_cold,matmul_mid,extraction_variants,matmul_end"
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        handlers=[logging.StreamHandler(), logging.FileHandler(a.out / "bench.log")])
    stages = a.stages.split(",")
    res = Results(a.out, {"command": shlex.join([sys.executable, *sys.argv]), "size": a.size, "gpu": gpu_info(),
                          "versions": versions(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "args": vars(a),
                          "commit": os.environ.get("BENCH_COMMIT") or _git_commit(), "host": host_info()})
    target = a.work / "target"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ctx: dict = {}

    def stage(name, fn, *needs_gpus):
        if name not in stages:
            return
        if needs_gpus and gpus < needs_gpus[0]:
            res.data["errors"][name] = f"not run: needs {needs_gpus[0]} GPUs, found {gpus}"
            res.save()
            return
        t0 = time.perf_counter()
        log.info("=== stage %s", name)
        try:
            value = fn()
            value["stage_s"] = round(time.perf_counter() - t0, 1)
            res.put(name, value)
            ctx[name] = value
        except Exception as err:  # noqa: BLE001 - record and go on with the next stage
            res.error(name, err)

    if a.only:
        def mm():  # short (the earlier runs' setting), longer, and about 1.5 s of products
            runs = {f"{w}+{i}": matmul_rate(a.size, w, i)["tflops"] for w, i in ((3, 10), (20, 100), (20, 1000))}
            got = [v for v in runs.values() if v]
            return {"tflops_by_warmup_and_timed_products": runs, "tflops": max(got) if got else None}
    else:
        def mm():
            return matmul_rate(a.size)
    stage("matmul", mm)
    stage("target", lambda: build_target(target, a.size))
    stage("data", lambda: build_data(a.work, target, a.rows, a.seq_len, min(a.draft_vocab, SIZES[a.size]["vocab_size"] // 2),
                                     SIZES[a.size]["vocab_size"]))
    flops = None
    if "data" in ctx:
        work_ = decoder_work(a.size, ctx["data"]["lengths"], ctx.get("target", {}).get("decoder_linear_params"))
        res.put("decoder_work", work_)
        flops = work_["flops_per_token"]
    tflops = res.data["stages"].get("matmul", {}).get("tflops")
    stage("extraction", lambda: extraction(a.work, target, a.batch_tokens, flops, tflops))
    stage("plain_forward", lambda: plain_forward(a.work, target, a.batch_tokens, 8))
    # The stage in fresh processes: right after the target was saved (its pages still being
    # written out), after `sync`, and with the page cache dropped (target read from disk).
    stage("headline", lambda: headline(a.work, target, 3))
    stage("headline_synced", lambda: headline(a.work, target, 3, sync_first=True))
    stage("headline_disk_cold", lambda: headline(a.work, target, 2, drop_caches=True))
    stage("matmul_mid", mm)
    stage("extraction_variants", lambda: extraction_variants(a.work, target, a.batch_tokens, a.rounds))
    stage("matmul_end", mm)
    rates = [res.data["stages"][k]["tflops"] for k in ("matmul", "matmul_mid", "matmul_end")
             if res.data["stages"].get(k, {}).get("tflops")]
    if rates and flops:
        # The highest rate measured in this call: the GPU reached it, so the fraction is not flattered.
        r = max(rates)
        limit = r * 1e12 / flops
        fr: dict = {}
        for k in ("headline", "headline_synced", "headline_disk_cold"):
            for c in res.data["stages"].get(k, {}).get("calls", []):
                fr[f"{k}_call{c['call']}"] = round(c["tokens_per_s"] / limit, 3)
        for k, m in res.data["stages"].get("extraction_variants", {}).get("summary", {}).items():
            fr[f"variant_{k}_median"] = round(m["median"] / limit, 3)
        res.put("compute_limit", {"matmul_tflops_measured": rates, "matmul_tflops_used": r,
                                  "flops_per_token": flops, "tokens_per_s": round(limit, 1),
                                  "formula": "limit = highest bf16 matmul rate measured in the call / F",
                                  "fraction_of_limit": fr})
    stage("train_1gpu", lambda: training(a.work, target, "train_1gpu", 1, a.epochs, a.total_seq_len))
    if "train_1gpu" in ctx:
        stage("checkpoint", lambda: checkpoint_check(Path(ctx["train_1gpu"]["final"])))
    # The same run with the data loader in the training process (the CPU path's setting).
    stage("train_1gpu_workers0", lambda: training(a.work, target, "train_1gpu_workers0", 1, a.epochs,
                                                  a.total_seq_len, num_workers=0))
    stage("reference_fwd_bwd", lambda: reference_fwd_bwd(a.work, target, a.total_seq_len, 20))
    stage("train_ddp2", lambda: training(a.work, target, "train_ddp2", 2, a.epochs, a.total_seq_len), 2)
    if "train_ddp2" in ctx:
        stage("checkpoint_ddp", lambda: checkpoint_check(Path(ctx["train_ddp2"]["final"])))
    stage("parallel_shards", lambda: parallel_shards(a.work, target, a.batch_tokens), 2)
    stage("train_fsdp2", lambda: training(a.work, target, "train_fsdp2", 2, a.epochs, a.total_seq_len, fsdp=True), 2)
    if "train_fsdp2" in ctx:
        stage("checkpoint_fsdp", lambda: checkpoint_check(Path(ctx["train_fsdp2"]["final"])))
    res.data["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    res.save()
    (a.out / "results.md").write_text(markdown(res.data))
    log.info("done: %s", a.out / "results.md")


def extract_shard_main() -> None:
    """One extraction shard, as scripts/hidden_states.py runs it (a subprocess per GPU)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--target", type=Path)
    ap.add_argument("--out-dir", type=Path)
    ap.add_argument("--shard", type=int)
    ap.add_argument("--num-shards", type=int)
    ap.add_argument("--batch-tokens", type=int)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s shard{a.shard} %(name)s %(message)s")
    from draftline.devices import claim_gpus
    from draftline.engine import EngineSettings
    from draftline.hidden_states import extract_shard

    # As scripts/hidden_states.py does: take one free GPU before CUDA starts.
    got = claim_gpus(1)
    a.out_dir.parent.mkdir(parents=True, exist_ok=True)
    (a.out_dir.parent / f"claimed_{a.shard}.txt").write_text(f"{got} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    extract_shard(a.work / "dataset", a.target, a.work / "layer_ids.json", a.shard, a.num_shards, a.out_dir,
                  EngineSettings(threads=4), backend="transformers", options={"batch_tokens": a.batch_tokens},
                  staging_root=a.out_dir.parent / f".staging-{a.shard}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "extract-shard":
        extract_shard_main()
    elif len(sys.argv) > 1 and sys.argv[1] == "extract-calls":
        extract_calls_main()
    else:
        main()
