"""The pipeline's CUDA path, measured in one run (issues 8 and 7).

    PYTHONPATH=src python3 benchmarks/cuda/bench_cuda.py --out OUT --work /tmp/bench [--size 8b]

Builds a target with random weights (Llama-3.1-8B shape, bf16) and a dataset of random token
rows of realistic length, then runs the pipeline's own code on them:
- extraction: `draftline.stages.hidden_states.extract_shard(backend="transformers")` (what
  scripts/hidden_states.py calls), against the compute limit (the decoder's useful FLOPs per
  token, `decoder_work`, at the bf16 matmul rate measured here) and against a plain decoder
  forward of the same batches. `--only extraction` runs just that, in depth: the stage in a
  fresh process (first call cold, second call warm), like-for-like variants alternating in one
  process (`extraction_variants`), the matmul rate three times, a page-cache-cold first call;
- training: `draftline.stages.train.train` (what scripts/train.py calls: speculators' Trainer under
  torchrun), against a plain forward+backward loop of the same draft on the Trainer's own batch;
  peak GPU memory from nvidia-smi for both; the checkpoint is loaded back with speculators;
- with 2 GPUs (issue 7): training with 2 processes (DDP, then --fsdp-shard) against 1, and
  two extraction shards at once on distinct GPUs (CUDA_VISIBLE_DEVICES) against the same
  shards run one after the other;
- the vLLM rates (issue 34, run only when named in --stages): `extraction_vllm`, the stage with
  the vllm backend against plain vLLM prefill of the same rows and the transformers backend, each
  in a fresh process, alternated, `--rounds` times, paired per round; `regeneration`, greedy
  answers through `regenerate_shard` at the 8B recipe's batch sizes, engine start apart.
One module per measurement, beside this entry point: common.py (sizes, the random target and
dataset), compute.py (matmul rate, decoder work, compute
limit), extraction.py (the stage, the plain forward, the variants), fresh_process.py (the stage's
first and warm calls in a fresh process; `bench_cuda.py extract-calls` is its child),
training.py (train, reference forward+backward, checkpoint check), shards.py (two shards at
once; `bench_cuda.py extract-shard` is one shard), extraction_vllm.py (`bench_cuda.py
extract-variant` is one variant's process), regeneration.py (`bench_cuda.py regenerate-batches`
is its process), report.py (results.md). The record (header, results file, device and host
facts, GPU memory) is the benchmarks' one harness's, benchmarks/record_run.py.
Each stage appends its figures to OUT/results.json (rewritten after every stage, so a run cut
short keeps what it measured) and OUT/results.md is written at the end. `--size tiny` runs the
same code on a toy target (on CPU when there is no GPU) to check the script.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the measurement modules beside it

from common import SIZES, build_data, build_target, log  # noqa: E402
from compute import compute_limit, decoder_work, matmul_rate  # noqa: E402
from extraction import extraction, extraction_variants, plain_forward  # noqa: E402
from extraction_vllm import extract_variant_main, extraction_vllm  # noqa: E402
from fresh_process import extract_calls_main, headline  # noqa: E402
from record_run import Results, git_commit, gpu_info, gpu_versions, host_info, log_to  # noqa: E402
from regeneration import recipe_settings, regenerate_batches_main, regeneration  # noqa: E402
from shards import extract_shard_main, parallel_shards  # noqa: E402
from training import checkpoint_check, reference_fwd_bwd, training  # noqa: E402

from report import markdown  # noqa: E402

# The measurements a plain run makes (--stages picks some); train_ddp2 and the ones after it
# need two GPUs (recorded as not run otherwise).
STAGES = ("matmul,target,data,extraction,plain_forward,train_1gpu,checkpoint,extraction_variants,reference_fwd_bwd,"
          "train_ddp2,checkpoint_ddp,parallel_shards,train_fsdp2,checkpoint_fsdp")
# Run only when named in --stages (or by --only).
MORE_STAGES = ("train_1gpu_workers0", "headline", "headline_synced", "headline_disk_cold", "matmul_mid", "matmul_end",
               "extraction_vllm", "regeneration")
# The vLLM rates (issue 34): `--stages` with these, the matmul rate before, between and after.
RATE_STAGES = "matmul,target,data,regeneration,matmul_mid,extraction_vllm,matmul_end"
# `--only extraction`: the stage in a fresh process, the variants, the matmul rate around them.
EXTRACTION_STAGES = ("matmul,target,data,headline,headline_synced,headline_disk_cold,matmul_mid,extraction_variants,"
                     "matmul_end")


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
    ap.add_argument("--stages", default=STAGES, help=f"the measurements to run, comma-separated (default: "
                    f"{', '.join(STAGES.split(','))}); these run only when named: {', '.join(MORE_STAGES)}; the vLLM "
                    f"rates: --stages {RATE_STAGES}")
    ap.add_argument("--only", choices=["extraction"], help="extraction: the stage in a fresh process (first "
                    "and second call), the like-for-like variants, the matmul rate before, between and after, "
                    "and a first call with the page cache dropped (overrides --stages)")
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of each extraction variant (extraction_variants, "
                    "extraction_vllm)")
    ap.add_argument("--chunk-rows", type=int, default=64, help="extraction_vllm: rows per call (the hidden_states "
                    "rule's chunk_rows)")
    recipe = recipe_settings()
    ap.add_argument("--regen-batches", default=",".join(map(str, recipe["batches"])),
                    help="regeneration: conversations per call, comma-separated (default: the 8B recipe's, "
                    "preflight.prompts and regenerate.chunk_conversations)")
    ap.add_argument("--regen-rounds", type=int, help="regeneration: repetitions of each batch (default: --rounds)")
    ap.add_argument("--max-new-tokens", type=int, default=recipe["max_new_tokens"],
                    help="regeneration: regenerate.max_new_tokens (default: the 8B recipe's)")
    ap.add_argument("--max-model-len", type=int, default=recipe["max_model_len"],
                    help="regeneration: the engine's max_model_len, tokenize.max_seq_len (default: the 8B recipe's)")
    a = ap.parse_args()
    if a.only == "extraction":
        a.stages = EXTRACTION_STAGES
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    log_to(a.out / "bench.log")
    stages = a.stages.split(",")
    res = Results(a.out, {"command": shlex.join([sys.executable, *sys.argv]), "size": a.size, "gpu": gpu_info(),
                          "versions": gpu_versions(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "args": vars(a),
                          "commit": git_commit(), "host": host_info()})
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

    if a.only or "extraction_vllm" in stages:
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
    def keep(name):
        """A measurement's figures so far, and the limit's fractions of them: a run cut short keeps both."""
        def put(partial):
            res.put(name, partial)
            limit_ = compute_limit(res.data["stages"], flops)
            if limit_:
                res.put("compute_limit", limit_)
        return put

    # The vLLM rates: regeneration first (one process), then the extraction rounds, each process's
    # figures kept as it ends.
    stage("regeneration", lambda: regeneration(a.work, target, [int(b) for b in a.regen_batches.split(",")],
                                               a.regen_rounds or a.rounds, a.max_new_tokens, a.max_model_len,
                                               keep("regeneration")))
    stage("matmul_mid", mm)
    stage("extraction_vllm", lambda: extraction_vllm(a.work, target, a.rounds, a.chunk_rows, keep("extraction_vllm")))
    stage("extraction_variants", lambda: extraction_variants(a.work, target, a.batch_tokens, a.rounds))
    stage("matmul_end", mm)
    limit = compute_limit(res.data["stages"], flops)
    if limit:
        res.put("compute_limit", limit)
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


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "extract-shard":
        extract_shard_main()
    elif len(sys.argv) > 1 and sys.argv[1] == "extract-calls":
        extract_calls_main()
    elif len(sys.argv) > 1 and sys.argv[1] == "extract-variant":
        extract_variant_main()
    elif len(sys.argv) > 1 and sys.argv[1] == "regenerate-batches":
        regenerate_batches_main()
    else:
        main()
