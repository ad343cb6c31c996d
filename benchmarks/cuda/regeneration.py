"""Regeneration's rate: greedy answers through the stage's own `regenerate_shard` (what
scripts/regenerate.py calls), at the batch sizes of the 8B recipe (issue 34, part 3).

One fresh process starts one engine as the shard job does (`target_llm` with the run's engine
settings: max_model_len = tokenize.max_seq_len) and hands it to `regenerate_shard` once per
batch size and round, each time on a prompts file of `batch` conversations answered in one chunk
(`chunk_conversations` = batch: one `LLM.chat` call of `batch` prompts), with the recipe's
max_new_tokens, temperature 0. The engine start is timed apart; the rate is the stage's own
(`tokens_per_second` of its summary: generated tokens / the answering's seconds).

The prompts are the shipped set's (resources/prompts/default.jsonl), each cut to its first user
turn (and the system turn before it), so that every call is one round of `batch` answers; rows
are reused in order when a batch is larger than the set. On a random-weight target an answer
rarely meets the end-of-turn token: answers run to max_new_tokens (a longest-case rate). The
child process is `bench_cuda.py regenerate-batches`.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml
from common import ENTRY, log
from record_run import summarize

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "resources" / "prompts" / "default.jsonl"
RECIPE = REPO / "config" / "presets" / "dense_8b.yaml"


def recipe_settings() -> dict:
    """The 8B recipe's regeneration sizes (config/presets/dense_8b.yaml over the schema's
    defaults): the batches it runs (preflight's batch, then regenerate.chunk_conversations),
    max_new_tokens and max_model_len (tokenize.max_seq_len)."""
    from draftline.settings import default

    preset = yaml.safe_load(RECIPE.read_text())

    def get(block, key):
        return (preset.get(block) or {}).get(key, default(block, key))

    return {"batches": sorted({get("preflight", "prompts"), get("regenerate", "chunk_conversations")}),
            "max_new_tokens": get("regenerate", "max_new_tokens"), "max_model_len": get("tokenize", "max_seq_len")}


def _first_turns(count: int) -> list[dict]:
    rows = []
    for line in PROMPTS.read_text(encoding="utf-8").splitlines():
        messages = json.loads(line)["messages"]
        user = next(i for i, m in enumerate(messages) if m["role"] == "user")
        rows.append(messages[: user + 1])
    return [{"id": f"bench-{i}", "source": PROMPTS.name, "messages": rows[i % len(rows)]} for i in range(count)]


def regenerate_batches_main() -> None:
    """A fresh process: one engine, then `regenerate_shard` once per batch size and round; writes
    the timings to `--result` (JSON) after every call, so a run cut short keeps what it measured."""
    t_main = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--batches", required=True, help="conversations per call, comma-separated")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--max-model-len", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1, help="the rule's threads (one per vLLM rank)")
    ap.add_argument("--result", type=Path, required=True)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s regenerate %(name)s %(message)s")
    from dataclasses import replace

    from draftline.artifacts import conversations as conversation_file
    from draftline.runtime.devices import claim_gpus
    from draftline.runtime.shards import ShardJob
    from draftline.runtime.vllm_engine import EngineSettings, enforce_eager_for, has_cuda, shutdown, target_llm
    from draftline.stages.regenerate import RegenerateSettings, regenerate_shard, write_answer_settings

    t_imp = time.time()
    got = claim_gpus(1)
    batches = [int(b) for b in a.batches.split(",")]
    engine = EngineSettings(dtype="auto", enforce_eager=enforce_eager_for("auto", has_cuda()),
                            max_model_len=a.max_model_len)
    settings = engine.stage(RegenerateSettings, max_new_tokens=a.max_new_tokens, threads=a.threads)
    out = {"t_main_epoch": t_main, "imports_s": round(t_imp - t_main, 2), "claimed": got, "batches": batches,
           "max_new_tokens": a.max_new_tokens, "max_model_len": a.max_model_len, "temperature": settings.temperature,
           "runs": []}
    t0 = time.perf_counter()
    llm = target_llm(a.target, settings)
    out["engine_start_s"] = round(time.perf_counter() - t0, 2)
    a.result.write_text(json.dumps(out, indent=1) + "\n")
    for r in range(a.rounds):
        for batch in batches[r % len(batches):] + batches[: r % len(batches)]:  # rotated each round
            d = a.work / "regenerate" / f"round{r + 1}_batch{batch}"
            d.mkdir(parents=True, exist_ok=True)
            conversation_file.write(d / "prompts.jsonl", _first_turns(batch))
            write_answer_settings(d / "prompts.jsonl", d / "settings.json", {"benchmark": "regeneration", "round": r + 1})
            t1 = time.perf_counter()
            s = regenerate_shard(a.target, d / "prompts.jsonl", d / "settings.json", ShardJob(0, 1, d / "shard_0"),
                                 replace(settings, chunk_conversations=batch), llm=llm)
            out["runs"].append({"round": r + 1, "batch": batch, "call_wall_s": round(time.perf_counter() - t1, 2),
                                **{k: s.get(k) for k in ("seconds", "tokens_per_second", "generated_tokens",
                                                         "prompt_tokens", "turns_generated", "answers_truncated",
                                                         "rows_out")}})
            log.info("regeneration: round %d, batch %d: %s", r + 1, batch, out["runs"][-1])
            a.result.write_text(json.dumps(out, indent=1) + "\n")
    shutdown(llm)
    out["process_main_s"] = round(time.time() - t_main, 2)
    a.result.write_text(json.dumps(out, indent=1) + "\n")


def regeneration(work: Path, target: Path, batches: list[int], rounds: int, max_new_tokens: int,
                 max_model_len: int, save) -> dict:
    """The child process above, and each batch size's rate over the rounds (min / median / max)."""
    res = work / "regeneration.json"
    res.unlink(missing_ok=True)
    cmd = [sys.executable, ENTRY, "regenerate-batches", "--work", str(work), "--target", str(target),
           "--batches", ",".join(map(str, batches)), "--rounds", str(rounds), "--max-new-tokens", str(max_new_tokens),
           "--max-model-len", str(max_model_len), "--result", str(res)]
    t0 = time.time()
    done = subprocess.run(cmd, check=False)
    if not res.exists():
        raise RuntimeError(f"regenerate-batches wrote nothing (rc {done.returncode}): see the log above")
    out = json.loads(res.read_text())
    out["process_start_to_main_s"] = round(out.pop("t_main_epoch") - t0, 2)
    out["process_wall_s"] = round(time.time() - t0, 2)
    out["returncode"] = done.returncode
    out["command"] = shlex.join(cmd)
    out["recipe"] = {"file": str(RECIPE.relative_to(REPO)), **recipe_settings()}
    out["summary"] = {}
    for b in batches:
        got = [x for x in out["runs"] if x["batch"] == b and x["tokens_per_second"]]
        if got:
            out["summary"][str(b)] = {"tokens_per_s": summarize([x["tokens_per_second"] for x in got]),
                                      "generated_tokens_per_call": summarize([x["generated_tokens"] for x in got]),
                                      "truncated_share": round(sum(x["answers_truncated"] for x in got)
                                                               / max(1, sum(x["turns_generated"] for x in got)), 3)}
    save(out)
    if done.returncode != 0:
        raise RuntimeError(f"regenerate-batches ended with rc {done.returncode} after {len(out['runs'])} calls "
                           "(kept above): see the log")
    return out
