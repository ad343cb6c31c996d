"""Two extraction shards at once on distinct GPUs (each job claims a free one, as
scripts/hidden_states.py does) against the same shards one after the other. Each shard is a
child process, `bench_cuda.py extract-shard`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import ENTRY


def shard_cmd(work: Path, target: Path, out_dir: Path, shard: int, n: int, batch_tokens: int) -> list[str]:
    return [sys.executable, ENTRY, "extract-shard", "--work", str(work), "--target", str(target),
            "--out-dir", str(out_dir), "--shard", str(shard), "--num-shards", str(n),
            "--batch-tokens", str(batch_tokens)]


def parallel_shards(work: Path, target: Path, batch_tokens: int) -> dict:
    """Shards 0 and 1 of 2: one after the other on GPU 0, then at once, each job taking a free
    GPU through the scripts' local device assignment (`draftline.runtime.devices.claim_gpus(1)`)."""
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
    from draftline.runtime.devices import claim_gpus
    from draftline.runtime.shards import ShardJob
    from draftline.runtime.vllm_engine import EngineSettings
    from draftline.stages.hidden_states import ExtractionSettings, extract_shard

    # As scripts/hidden_states.py does: take one free GPU before CUDA starts.
    got = claim_gpus(1)
    a.out_dir.parent.mkdir(parents=True, exist_ok=True)
    (a.out_dir.parent / f"claimed_{a.shard}.txt").write_text(f"{got} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    job = ShardJob(a.shard, a.num_shards, a.out_dir, staging_root=a.out_dir.parent / f".staging-{a.shard}")
    extract_shard(a.work / "dataset", a.target, a.work / "layer_ids.json", job, EngineSettings(threads=4),
                  ExtractionSettings(backend="transformers", options={"batch_tokens": a.batch_tokens}))
