"""Batched greedy decoding on one GPU with transformers (no vLLM on the GPU machine): a measured
LOWER bound for regeneration's rate on an 8B-shaped target (random bf16 weights), beside the
rate docs/sizing.md assumes for vLLM (0.3 of the bf16 matmul rate / (2 x active parameters)).

    python3 benchmarks/cuda/bench_decode.py --out OUT [--batch 64 128 256] [--new-tokens 256]

transformers' default (dynamic) KV cache, no torch.compile, prompts of 128 random tokens,
`min_new_tokens` = `max_new_tokens` so every row decodes the same number of tokens. Each batch
size: one warm-up call, then 2 timed calls; tokens/s = batch x new tokens / wall seconds
(prefill included, ~1/3 of a percent of the tokens). Writes OUT/decode.json and OUT/decode.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)  # fmt: skip
ACTIVE_LINEAR_8B = 6_979_321_856  # docs/gpu.md: the 32 decoder layers' linear weights
MATMUL_FLOPS = 787.8e12  # one H200, bf16, measured (h200_8b_extraction_recheck.json)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM, __version__ as tf_version

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_8B, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    started = time.time()
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    build_s = time.time() - started
    results = {
        "command": " ".join([sys.executable, *sys.argv]),
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "transformers": tf_version,
        "python": platform.python_version(), "build_s": round(build_s, 1),
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "runs": [],
    }  # fmt: skip
    for batch in args.batch:
        ids = torch.randint(3, config.vocab_size, (batch, args.prompt_tokens), device="cuda")
        kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                      attention_mask=torch.ones_like(ids))  # fmt: skip
        with torch.inference_mode():
            model.generate(ids, **kwargs)  # warm-up (kernels, allocator)
            times = []
            for _ in range(2):
                torch.cuda.synchronize()
                t = time.perf_counter()
                generated = model.generate(ids, **kwargs)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
        new = generated.shape[1] - args.prompt_tokens
        rates = [batch * new / s for s in times]
        limit = MATMUL_FLOPS / (2 * ACTIVE_LINEAR_8B)
        results["runs"].append({
            "batch": batch, "new_tokens": new, "seconds": [round(s, 2) for s in times],
            "tokens_per_s": [round(r) for r in rates], "fraction_of_matmul_limit": round(max(rates) / limit, 3),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        })  # fmt: skip
        print(json.dumps(results["runs"][-1]), flush=True)
        (out / "decode.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"# Batched greedy decoding, transformers generate, 8B shape, {results['gpu']}", "",
             f"`{results['command']}` (commit {results['git_commit']}, torch {results['torch']}, "
             f"transformers {results['transformers']})", "",
             "| batch | new tokens | seconds (2 runs) | tokens/s | of the matmul limit |", "|---|---|---|---|---|"]  # fmt: skip
    for run in results["runs"]:
        lines.append(f"| {run['batch']} | {run['new_tokens']} | {run['seconds']} | {run['tokens_per_s']} | "
                     f"{run['fraction_of_matmul_limit']} |")  # fmt: skip
    (out / "decode.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
