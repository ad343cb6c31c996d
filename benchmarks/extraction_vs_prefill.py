"""Hidden-state extraction throughput vs plain vLLM prefill, measured in the same run.

Both engines load the same target with the same settings (dtype, eager/compiled, no prefix
caching) and process the same rows with max_tokens=1; the extraction side is the pipeline's
own path (`draftline.hidden_states.Extractor`: generate, wait for each file's write, validate,
move). Repeats alternate the two so load from other processes hits both alike; the ratio of
median tokens/s is printed (target >= 0.90) and written as JSON + markdown.

    PYTHONPATH=src .venv/bin/python benchmarks/extraction_vs_prefill.py --model embedded \
        --rows 48 --seq-len 256 --threads 1 --out benchmarks/results/extraction_vs_prefill_smollm2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 0.90


def _target(model: str, tmp: Path) -> Path:
    if model == "embedded":
        from draftline.target_model import materialize_embedded

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="'embedded' (SmolLM2-135M), 'tiny', or a HF folder")
    p.add_argument("--dataset", help="tokenized dataset folder (default: random token rows)")
    p.add_argument("--rows", type=int, default=48)
    p.add_argument("--seq-len", type=int, default=256, help="longest random row (shortest is half)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--enforce-eager", default="auto", choices=["auto", "true", "false"])
    p.add_argument("--chunk-rows", type=int, default=64, help="rows per generate call, as in the pipeline")
    p.add_argument("--out", help="write OUT.json and OUT.md")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from draftline import hidden_states as hs
    from draftline.engine import configure_vllm_cpu, default_dtype
    from draftline.layers import resolve_layer_ids

    configure_vllm_cpu(args.threads)
    load_start = [round(x, 1) for x in os.getloadavg()]
    dtype = default_dtype(args.dtype)
    eager = hs.resolve_enforce_eager({"true": True, "false": False}.get(args.enforce_eager, "auto"))
    with tempfile.TemporaryDirectory(prefix="hs-bench-") as tmp_name:
        tmp = Path(tmp_name)
        target = _target(args.model, tmp)
        info = hs.target_info(target)
        extracted = resolve_layer_ids("auto", str(target)).extracted
        rows = _rows(args, target)
        tokens = sum(map(len, rows))
        max_len = max(map(len, rows)) + 1
        common = dict(max_model_len=max_len, dtype=dtype, enforce_eager=eager)

        t0 = time.perf_counter()
        prefill = hs.make_llm(target, **common)
        load_prefill = time.perf_counter() - t0
        scratch, dest = tmp / "vllm", tmp / "files"
        scratch.mkdir()
        t0 = time.perf_counter()
        llm = hs.make_llm(target, **common, **hs.extraction_engine_kwargs(target, extracted, scratch, dtype))
        load_extract = time.perf_counter() - t0
        extractor = hs.Extractor(llm, len(extracted), info.hidden_size, dtype)

        def run_prefill() -> None:
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            prefill.generate([TokensPrompt(prompt_token_ids=r) for r in rows],
                             SamplingParams(max_tokens=1), use_tqdm=False)

        def run_extract() -> None:
            dest.mkdir(exist_ok=True)
            hs.run_chunks(extractor, range(len(rows)), rows, dest, args.chunk_rows)

        # Warm-up: the first batch pays for allocations and kernel selection.
        run_prefill()
        run_extract()
        times: dict[str, list[float]] = {"prefill": [], "extract": []}
        for rep in range(args.repeats):
            for name, fn in (("prefill", run_prefill), ("extract", run_extract)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            print(f"repeat {rep}: prefill {tokens / times['prefill'][-1]:.0f} tok/s, "
                  f"extract {tokens / times['extract'][-1]:.0f} tok/s, ratio "
                  f"{times['prefill'][-1] / times['extract'][-1]:.3f}", flush=True)
        file_bytes = sum(f.stat().st_size for f in dest.iterdir())
        hs.shutdown_llm(prefill)
        hs.shutdown_llm(llm)

    tps = {k: tokens / statistics.median(v) for k, v in times.items()}
    ratio = tps["extract"] / tps["prefill"]
    result = {
        "command": shlex.join(["PYTHONPATH=src", os.path.relpath(sys.executable), *sys.argv]),
        "model": args.model,
        "target_layers": info.num_hidden_layers,
        "hidden_size": info.hidden_size,
        "extracted_layers": extracted,
        "rows": len(rows),
        "tokens": tokens,
        "longest_row": max_len - 1,
        "dtype": dtype,
        "enforce_eager": eager,
        "threads": args.threads,
        "repeats": args.repeats,
        "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "ratio_per_repeat": [round(p / e, 3) for p, e in zip(times["prefill"], times["extract"])],
        "chunk_rows": args.chunk_rows,
        "load_average": {"start": load_start, "end": [round(x, 1) for x in os.getloadavg()]},
        "prefill_tokens_per_s": round(tps["prefill"], 1),
        "extract_tokens_per_s": round(tps["extract"], 1),
        "ratio": round(ratio, 3),
        "meets_target": ratio >= TARGET_RATIO,
        "bytes_per_token": round(file_bytes / tokens, 1),
        "engine_load_s": {"prefill": round(load_prefill, 1), "extract": round(load_extract, 1)},
        "versions": hs.versions(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }
    print(f"prefill {tps['prefill']:.0f} tok/s, extraction {tps['extract']:.0f} tok/s, "
          f"ratio {ratio:.3f} (target >= {TARGET_RATIO})")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(_markdown(result))


def _markdown(r: dict) -> str:
    return "\n".join([
        f"# Hidden-state extraction vs plain prefill: {r['model']}",
        "",
        f"`{r['command']}`",
        "",
        f"- target: {r['target_layers']} layers, hidden {r['hidden_size']}; extracted layers "
        f"{r['extracted_layers']}; dtype {r['dtype']}; enforce_eager {r['enforce_eager']}; "
        f"{r['threads']} thread(s)",
        f"- rows: {r['rows']} ({r['tokens']} tokens, longest {r['longest_row']}); "
        f"{r['repeats']} alternating repeats after a warm-up; median shown",
        "",
        "| | tokens/s | seconds per repeat |",
        "|---|---|---|",
        f"| plain prefill (max_tokens=1) | {r['prefill_tokens_per_s']} | {r['seconds']['prefill']} |",
        f"| extraction (pipeline path: chunks of {r['chunk_rows']} rows; generate, wait for "
        f"write, validate, move) | {r['extract_tokens_per_s']} | "
        f"{r['seconds']['extract']} |",
        "",
        f"ratio per repeat (paired): {r['ratio_per_repeat']}; machine load average "
        f"{r['load_average']} (1/5/15 min; shared 2-core machine, so single repeats are noisy)",
        "",
        f"**ratio of medians {r['ratio']}** (target >= {TARGET_RATIO}: {'met' if r['meets_target'] else 'NOT met'}); "
        f"{r['bytes_per_token']} bytes/token on disk; engine load {r['engine_load_s']} s",
        "",
        f"versions: {r['versions']}, Python {r['python']}, {r['machine']}",
        "",
    ])


if __name__ == "__main__":
    main()
