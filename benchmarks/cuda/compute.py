"""The compute reference: the bf16 matmul rate measured on the GPU, the decoder's useful work per
token, and the limit they give (tokens/s no extraction can beat)."""

from __future__ import annotations

import torch
from common import SIZES, sync


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


def compute_limit(stages: dict, flops: float | None) -> dict | None:
    """The highest matmul rate measured in this call over F, and each extraction figure's fraction
    of it; None without a measured rate or F."""
    rates = [stages[k]["tflops"] for k in ("matmul", "matmul_mid", "matmul_end") if stages.get(k, {}).get("tflops")]
    if not rates or not flops:
        return None
    # The highest rate measured in this call: the GPU reached it, so the fraction is not flattered.
    r = max(rates)
    limit = r * 1e12 / flops
    fr: dict = {}
    for k in ("headline", "headline_synced", "headline_disk_cold"):
        for c in stages.get(k, {}).get("calls", []):
            fr[f"{k}_call{c['call']}"] = round(c["tokens_per_s"] / limit, 3)
    for k, m in stages.get("extraction_variants", {}).get("summary", {}).items():
        fr[f"variant_{k}_median"] = round(m["median"] / limit, 3)
    # extraction_vllm: each variant's steady rate (min, median, max over the rounds)
    for k, m in stages.get("extraction_vllm", {}).get("summary", {}).items():
        t = m["tokens_per_s"]
        fr[f"vllm_{k}"] = {x: round(t[x] / limit, 3) for x in ("min", "median", "max")}
    out = {"matmul_tflops_measured": rates, "matmul_tflops_used": r, "flops_per_token": flops,
           "tokens_per_s": round(limit, 1), "formula": "limit = highest bf16 matmul rate measured in the call / F",
           "fraction_of_limit": fr}
    # regeneration as draftline.planning.sizing reads decoding: tokens/s x 2 x P_lin over the matmul rate
    p_lin = stages.get("decoder_work", {}).get("P_lin")
    regen = stages.get("regeneration", {}).get("summary", {})
    if p_lin and regen:
        out["decode_fraction"] = {"formula": "median generated tokens/s x 2 x P_lin / the matmul rate used "
                                             "(sizing's DECODE_FRACTION)",
                                  **{b: round(m["tokens_per_s"]["median"] * 2 * p_lin / (r * 1e12), 3)
                                     for b, m in regen.items()}}
    return out
