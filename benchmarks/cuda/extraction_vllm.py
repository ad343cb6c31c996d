"""Extraction with the vLLM backend against plain vLLM prefill of the same rows (issue 34, part 3).

Three variants, each in a fresh process that starts one engine, as a shard job does; alternated
(the order rotates every round) and repeated `rounds` times:
- stage_vllm: `extract_shard` with the vllm backend, as scripts/hidden_states.py calls it (the
  GPU claimed first, the pipeline's engine settings, `hidden_states.chunk_rows` rows per call);
- plain_prefill: the same rows through `LLM.generate` (prompt token ids, max_tokens=1) on an
  engine of the same settings (`target_llm` with what the backend passes besides its connector:
  max_model_len = the longest row + 1, no prefix caching, the extraction's GPU share), in the
  same chunks, nothing captured or written;
- stage_transformers: `extract_shard` with the transformers backend, the same call otherwise.

Each process reports its start-up apart from the steady part: for the stages the manifest's
`load_seconds` (the engine or model load) and `extract_seconds` (the rows: for vllm, generate +
wait for each file + validate + move, `run_chunks`; for vllm, by phase: the engine calls, the wait for
an earlier chunk's files, the last chunk's files), the rest of the call (fidelity check,
publish) as wall time; for the plain prefill the engine start and the generate calls. The
rates compared are steady tokens/s (tokens / extract_seconds or the generate calls' seconds);
tokens / the whole call's wall time is beside them. The paired ratio of a round is
stage_vllm / plain_prefill of that round; beside it the stage's engine calls alone against plain
prefill's, which tells the engine's share of a gap (the connector's copies and writes) from the
files' (validation the next prefill does not hide). The child process is `bench_cuda.py extract-variant`.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import ENTRY, log
from record_run import summarize

VARIANTS = ("stage_vllm", "plain_prefill", "stage_transformers")
# The goal of issue 34: the stage's steady rate within this fraction of plain prefill.
GOAL = 0.95


def pipeline_engine_settings(threads: int):
    from draftline.runtime.vllm_engine import EngineSettings, enforce_eager_for, has_cuda

    # What the plan gives a run that leaves target.dtype and the vllm: block at their defaults:
    # dtype resolved by the job (bfloat16 on CUDA), eager mode as the plan resolves "auto".
    return EngineSettings(dtype="auto", enforce_eager=enforce_eager_for("auto", has_cuda()), threads=threads)


def extract_variant_main() -> None:
    """A fresh process that runs one variant once on the work folder's dataset and writes its
    timings to `--result` (JSON)."""
    t_main = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--chunk-rows", type=int, default=64, help="rows per call (hidden_states.chunk_rows)")
    ap.add_argument("--threads", type=int, default=1, help="the job's threads: the rule's, one per vLLM rank "
                    "(vLLM's CPU threads; unused on CUDA)")
    ap.add_argument("--result", type=Path, required=True)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {a.variant} %(name)s %(message)s")
    from draftline.runtime.devices import claim_gpus

    t_imp = time.time()
    got = claim_gpus(1)  # what the script does first: before CUDA starts
    t_claim = time.time()
    engine = pipeline_engine_settings(a.threads)
    out = {"variant": a.variant, "t_main_epoch": t_main, "imports_s": round(t_imp - t_main, 2),
           "claim_gpus_s": round(t_claim - t_imp, 2), "claimed": got, "chunk_rows": a.chunk_rows}
    if a.variant == "plain_prefill":
        out.update(_plain_prefill(a.work, a.target, engine, a.chunk_rows))
    else:
        out.update(_stage(a.work, a.target, engine, a.chunk_rows, a.variant.removeprefix("stage_")))
    out["process_main_s"] = round(time.time() - t_main, 2)
    a.result.write_text(json.dumps(out, indent=1) + "\n")


def _stage(work: Path, target: Path, engine, chunk_rows: int, backend: str) -> dict:
    from draftline.runtime.shards import ShardJob
    from draftline.stages.hidden_states import ExtractionSettings, extract_shard

    dest = work / f"hs_{backend}" / "shard_0"
    t0 = time.perf_counter()
    m = extract_shard(work / "dataset", target, work / "layer_ids.json", ShardJob(0, 1, dest), engine,
                      ExtractionSettings(backend=backend, rows_per_call=chunk_rows))
    wall = time.perf_counter() - t0
    shutil.rmtree(dest.parent)  # the next process writes its own; the disk holds one shard at a time
    phases = m.get("extract_seconds_by_phase") or {}  # vllm: run_chunks' ChunkTimes
    return {"tokens": m["tokens"], "rows": m["num_rows"], "load_s": m["load_seconds"], "steady_s": m["extract_seconds"],
            "call_wall_s": round(wall, 2), "tokens_per_s": m["tokens_per_s"],
            "tokens_per_wall_s": round(m["tokens"] / wall, 1), "bytes": m["bytes"], "steady_s_by_phase": phases,
            **({"prefill_tokens_per_s": round(m["tokens"] / phases["prefill"], 1)} if phases.get("prefill") else {}),
            "fidelity": {k: (m.get("fidelity") or {}).get(k) for k in ("top1_assistant", "min_top1", "rows")}}


def _plain_prefill(work: Path, target: Path, engine, chunk_rows: int) -> dict:
    from dataclasses import replace

    from datasets import load_from_disk
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from draftline.runtime.vllm_engine import default_dtype, shutdown, target_llm

    t0 = time.perf_counter()
    ids = load_from_disk(str(work / "dataset")).with_format(None)["input_ids"]
    settings = replace(engine, dtype=default_dtype(engine.dtype), max_model_len=max(map(len, ids)) + 1)
    t1 = time.perf_counter()
    # the backend's engine less its connector: same settings, no prefix caching, the same GPU share
    llm = target_llm(target, settings, enable_prefix_caching=False, in_process=False, extraction=True)
    load = time.perf_counter() - t1
    t2 = time.perf_counter()
    for i in range(0, len(ids), chunk_rows):
        llm.generate([TokensPrompt(prompt_token_ids=list(x)) for x in ids[i : i + chunk_rows]],
                     SamplingParams(max_tokens=1), use_tqdm=False)
    steady = time.perf_counter() - t2
    shutdown(llm)
    tokens = sum(map(len, ids))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "rows": len(ids), "load_s": round(load, 2), "steady_s": round(steady, 2),
            "call_wall_s": round(wall, 2), "tokens_per_s": round(tokens / steady, 1),
            "tokens_per_wall_s": round(tokens / wall, 1)}


def extraction_vllm(work: Path, target: Path, rounds: int, chunk_rows: int, save, threads: int = 1) -> dict:
    """The three variants, alternated, `rounds` times; `save(partial)` after every process, so
    a run cut short keeps the rounds it finished."""
    runs: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    order: list[str] = []
    errors: list[dict] = []
    out: dict = {}
    for r in range(rounds):
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[: r % len(VARIANTS)]:  # rotated each round
            res = work / f"variant_{variant}_{r + 1}.json"
            cmd = [sys.executable, ENTRY, "extract-variant", "--variant", variant, "--work", str(work),
                   "--target", str(target), "--chunk-rows", str(chunk_rows), "--threads", str(threads),
                   "--result", str(res)]
            log.info("extraction_vllm: round %d, %s", r + 1, variant)
            res.unlink(missing_ok=True)
            t0 = time.time()
            done = subprocess.run(cmd, check=False)
            if done.returncode != 0 or not res.exists():
                errors.append({"round": r + 1, "variant": variant, "returncode": done.returncode})
                log.error("extraction_vllm: round %d, %s failed (rc %s): see the log above", r + 1, variant,
                          done.returncode)
            else:
                rec = json.loads(res.read_text())
                rec["process_start_to_main_s"] = round(rec.pop("t_main_epoch") - t0, 2)
                rec["process_wall_s"] = round(time.time() - t0, 2)
                rec["round"] = r + 1
                runs[variant].append(rec)
            order.append(variant)
            out = _summary(runs, order, errors, rounds, chunk_rows, shlex.join(cmd))
            save(out)
    return out


def _summary(runs: dict[str, list[dict]], order: list[str], errors: list[dict], rounds: int, chunk_rows: int,
             command: str) -> dict:
    summary = {}
    for k, rs in runs.items():
        if rs:
            summary[k] = {f: summarize([x[f] for x in rs]) for f in ("tokens_per_s", "tokens_per_wall_s", "load_s")}
    ratios: dict[str, dict] = {}
    by_round = {k: {x["round"]: x for x in rs} for k, rs in runs.items()}
    # (variant, its rate) / (variant, its rate); the stage's prefill alone: its engine calls' seconds
    # (the manifest's extract_seconds_by_phase), which plain prefill's steady seconds are made of too
    for name, (a, fa, b, fb) in {
        "stage_vllm / plain_prefill": ("stage_vllm", "tokens_per_s", "plain_prefill", "tokens_per_s"),
        "stage_vllm's prefill alone / plain_prefill": ("stage_vllm", "prefill_tokens_per_s", "plain_prefill",
                                                        "tokens_per_s"),
        "stage_transformers / plain_prefill": ("stage_transformers", "tokens_per_s", "plain_prefill", "tokens_per_s"),
        "stage_vllm / stage_transformers": ("stage_vllm", "tokens_per_s", "stage_transformers", "tokens_per_s"),
    }.items():
        paired = sorted(r for r in set(by_round[a]) & set(by_round[b]) if by_round[a][r].get(fa))
        if paired:
            per = [round(by_round[a][r][fa] / by_round[b][r][fb], 3) for r in paired]
            ratios[name] = {"rounds": paired, **summarize(per)}
    goal = None
    main = ratios.get("stage_vllm / plain_prefill")
    if main:
        if main["min"] >= GOAL:
            goal = f"met: every round's stage / prefill >= {GOAL}"
        elif main["median"] >= GOAL:
            goal = f"not shown: the median is >= {GOAL}, the range (min-max of {main['n']} rounds) crosses it"
        else:
            goal = f"NOT met: the median is below {GOAL}"
    first = next((rs[0] for rs in runs.values() if rs), {})
    return {"rounds": rounds, "order": order, "chunk_rows": chunk_rows, "tokens": first.get("tokens"),
            "rows": first.get("rows"), "last_command": command, "goal": GOAL, "goal_verdict": goal,
            "rate": "steady tokens/s: tokens / extract_seconds (the stage's manifest; engine or model load apart) or "
                    "/ the generate calls' seconds (plain prefill); tokens_per_wall_s: the whole call",
            "runs": runs, "summary": summary, "paired_ratios": ratios, "errors": errors}

