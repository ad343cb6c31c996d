"""A vLLM CPU engine's start-up: the engine core in the job's process (draftline's choice for a
one-rank CPU engine, draftline.runtime.vllm_engine.configure_vllm_cpu) against vLLM's default EngineCore
process, paired in one run.

    python benchmarks/engine_start.py TARGET_DIR [--runs 5]

Each run is a fresh process (as a Snakemake job is): load the target as the stages do
(float32, eager, 1 thread), 16 greedy prompts x 48 tokens, shut down. The variants alternate
(A B A B ...) after one warm-up each, so a drift of the machine's speed hits both; printed: each
variant's load and generate seconds (min / median / max), the paired ratio of whole-process wall
times, and whether the greedy tokens were identical. Record: benchmarks/results/engine_start.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {"in-process": {}, "EngineCore process": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}}


def one_engine(target: str) -> None:
    sys.path.insert(0, str(REPO / "src"))
    t0 = time.time()
    from draftline.runtime.vllm_engine import EngineSettings, shutdown, target_llm

    llm = target_llm(target, EngineSettings(max_model_len=1024, dtype="float32", enforce_eager=True, threads=1))
    t1 = time.time()
    from vllm import SamplingParams

    prompts = [f"Write a sentence about the number {i}." for i in range(16)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    ids = [o.outputs[0].token_ids for o in outputs]
    t2 = time.time()
    shutdown(llm)
    print(json.dumps({"load_s": t1 - t0, "generate_s": t2 - t1,
                      "tokens": hashlib.sha256(repr(ids).encode()).hexdigest()[:16]}))


def run(target: str, env: dict) -> dict:
    start = time.time()
    out = subprocess.run([sys.executable, __file__, "--one", target], env={**os.environ, **env},
                         capture_output=True, text=True, check=True)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "wall_s": time.time() - start}


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one_engine(args.target)
    results = {name: [] for name in VARIANTS}
    for i in range(args.runs + 1):  # the first pair is the warm-up
        for name, env in VARIANTS.items():
            result = run(args.target, env)
            print(f"{'warm-up' if i == 0 else f'run {i}'} {name}: {result}", flush=True)
            if i:
                results[name].append(result)
    for name, rows in results.items():
        print(f"{name}: load s {spread([r['load_s'] for r in rows])}, generate s "
              f"{spread([r['generate_s'] for r in rows])}, wall s {spread([r['wall_s'] for r in rows])} (min / median / max)")
    a, b = results.values()
    print(f"wall ratio in-process / EngineCore process, pair by pair: {spread([x['wall_s'] / y['wall_s'] for x, y in zip(a, b)])}")
    print(f"greedy tokens identical in every run: {len({r['tokens'] for rows in results.values() for r in rows}) == 1}")


if __name__ == "__main__":
    main()
