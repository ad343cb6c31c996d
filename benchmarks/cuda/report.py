"""OUT/results.md from OUT/results.json: every measurement's figures, then the errors."""

from __future__ import annotations


def spread(m: dict, unit: str = "rounds", fmt: str = ",.0f") -> str:
    """The median in bold and its range: a min-max over so few rounds is a range, not an interval."""
    return f"**{m['median']:{fmt}}** | {m['min']:{fmt}}-{m['max']:{fmt}} (min-max of {m['n']} {unit})"


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
    lines += markdown_rates(s)
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
                  "| variant | tokens/s median | range | median / limit | GB/s written (median) |", "|---|---|---|---|---|"]
        for k, m in v["summary"].items():
            gb = m.get("gb_per_s_written", {}).get("median", "")
            lines.append(f"| {k} | {spread(m)} | {m['median'] / lim if lim else 0:.2f} | {gb} |")
        lines.append("")
    return lines


def markdown_rates(s: dict) -> list[str]:
    """The vLLM rates (issue 34): `extraction_vllm` and `regeneration`."""
    lines: list[str] = []
    lim = s.get("compute_limit", {}).get("tokens_per_s")

    def frac(x):
        return f"{x / lim:.3f}" if lim and x else "-"

    if "extraction_vllm" in s:
        v = s["extraction_vllm"]
        lines += ["## Extraction with the vLLM backend vs plain vLLM prefill (fresh processes, alternated)", "",
                  f"{v['rounds']} rounds of the three variants, each in its own process (one engine each), "
                  f"{v['rows']} rows, {v['tokens']:,} tokens, {v['chunk_rows']} rows per call; order: "
                  f"{', '.join(v['order'])}. Rate: {v['rate']}.", "",
                  "| variant | round | steady tokens/s | / limit | steady s | of it by phase | tokens / call wall s "
                  "| load s | call wall s | process wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
        for k, rs in v["runs"].items():
            for x in rs:
                phases = ", ".join(f"{p.replace('_', ' ')} {sec}" for p, sec in x.get("steady_s_by_phase", {}).items())
                lines.append(f"| {k} | {x['round']} | {x['tokens_per_s']:,.0f} | {frac(x['tokens_per_s'])} | "
                             f"{x.get('steady_s', '-')} | {phases or '-'} | "
                             f"{x['tokens_per_wall_s']:,.0f} | {x['load_s']} | {x['call_wall_s']} | "
                             f"{x.get('process_wall_s')} |")
        lines += ["", "| variant | steady tokens/s median | range | median / limit |", "|---|---|---|---|"]
        for k, m in v["summary"].items():
            t = m["tokens_per_s"]
            lines.append(f"| {k} | {spread(t)} | {frac(t['median'])} |")
        lines += ["", "| paired ratio (same round) | median | range | rounds |", "|---|---|---|---|"]
        for k, r in v["paired_ratios"].items():
            lines.append(f"| {k} | {spread(r, fmt='.3f')} | {r['rounds']} |")
        lines += ["", f"Goal (stage / plain prefill >= {v['goal']}): **{v['goal_verdict']}**"
                  + ("" if lim else "; no fraction of the compute limit (no matmul rate measured: not on CUDA)"), ""]
        if v.get("errors"):
            lines += [f"Failed processes: {v['errors']}", ""]
    if "regeneration" in s:
        g = s["regeneration"]
        lines += ["## Regeneration (`regenerate_shard`, greedy, one engine)", "",
                  f"Engine start {g.get('engine_start_s')} s (apart from the rates); max_new_tokens "
                  f"{g['max_new_tokens']}, max_model_len {g['max_model_len']}; batches {g['batches']} "
                  f"(the recipe: {g['recipe']}).", "",
                  "| round | batch | tokens/s (the stage's) | generated tokens | seconds | answers truncated |",
                  "|---|---|---|---|---|---|"]
        for x in g["runs"]:
            lines.append(f"| {x['round']} | {x['batch']} | {x['tokens_per_second']} | {x['generated_tokens']} | "
                         f"{x['seconds']} | {x['answers_truncated']} of {x['turns_generated']} |")
        lines += ["", "| batch | tokens/s median | range |", "|---|---|---|"]
        for b, m in g["summary"].items():
            lines.append(f"| {b} | {spread(m['tokens_per_s'])} |")
        decode = s.get("compute_limit", {}).get("decode_fraction")
        if decode:
            lines += ["", f"As sizing's decoding fraction ({decode['formula']}): "
                      + ", ".join(f"batch {b}: **{v}**" for b, v in decode.items() if b != "formula")]
        lines.append("")
    return lines
