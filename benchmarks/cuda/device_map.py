"""The transformers backend's split target (`device_map`) against the plain load, on one GPU.

What a job given several GPUs runs (draftline.backends.transformers: `device_map_for`, then
`load_decoder(placement=...)`), measured where only one GPU is lent: the map is computed for two
GPUs that each have room for 60% of the weights (so the target must be split), then both halves
are put on GPU 0 under two spellings (0 and "cuda:0"), so transformers still dispatches the model
with accelerate's hooks, exactly as for two GPUs, and the extractor gathers the captured layers.
This measures the hooks' cost and checks the states; it cannot measure the hop between GPUs.

    PYTHONPATH=src python3 benchmarks/cuda/device_map.py --out $OUT --work /tmp/dm --rows 96 --rounds 3
    (add --two-gpus on a machine with two GPUs: the halves then go to GPUs 0 and 1, as in a job)

Writes device_map.json and device_map.md to --out.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import build_target, git_commit, gpu_info, host_info, record_run, versions  # noqa: E402

from draftline.backends.transformers import (  # noqa: E402
    HFExtractor,
    batches,
    describe_device_map,
    device_map_for,
    load_decoder,
)

EXTRACTED = [2, 16, 29, 32]  # Llama-3.1-8B's auto aux layers + the last (as in the H200 recheck)


def run_all(extractor: HFExtractor, plan, ids_by_row) -> float:
    """Every batch through the decoder and to pinned host memory; seconds."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pending = []  # host tensors kept until their copies finish
    for batch in plan:
        pending.append(extractor.to_host(extractor.forward([ids_by_row[r] for r in batch])))
    for _, event in pending:
        event.synchronize()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--two-gpus", action="store_true",
                    help="put the halves on GPUs 0 and 1 as computed (nvidia-h200-x2), not both on GPU 0")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    record: dict = {**record_run.header(" ".join(sys.argv)), "versions": versions(), "commit": git_commit(),
                    "gpu": gpu_info(), "host": host_info()}

    target = args.work / "target"
    record["target"] = build_target(target, "8b")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(target))
    weights = record["target"]["bytes"]
    fake = {0: int(0.6 * weights), 1: int(0.6 * weights)}
    placement = device_map_for(config, fake, "bfloat16", source=str(target))
    record["device_map_two_gpus"] = describe_device_map(placement)
    # one GPU: both halves on GPU 0 under two spellings (the hooks still dispatch); two: as computed
    one_gpu = placement if args.two_gpus else {name: (0 if where == 0 else "cuda:0") for name, where in placement.items()}
    record["two_gpus"] = args.two_gpus

    t0 = time.perf_counter()
    plain = load_decoder(target, "bfloat16", "cuda")
    t1 = time.perf_counter()
    split = load_decoder(target, "bfloat16", "cuda", placement=one_gpu)
    t2 = time.perf_counter()
    hooked = sum(hasattr(m, "_hf_hook") for m in split.modules())
    record["load_s"] = {"plain": round(t1 - t0, 2), "device_map": round(t2 - t1, 2)}
    record["modules_with_accelerate_hooks"] = {"plain": sum(hasattr(m, "_hf_hook") for m in plain.modules()),
                                               "device_map": hooked}
    assert hooked > 0, "the device-map load attached no accelerate hooks: the split path was not exercised"

    rng = random.Random(0)
    lengths = [rng.randint(args.seq_len * 3 // 4, args.seq_len * 5 // 4) for _ in range(args.rows)]
    ids_by_row = {r: [rng.randrange(config.vocab_size) for _ in range(n)] for r, n in enumerate(lengths)}
    plan = batches(list(ids_by_row), {r: len(v) for r, v in ids_by_row.items()}, args.batch_tokens, 64)
    tokens = sum(lengths)
    record["data"] = {"rows": args.rows, "tokens": tokens, "batches": len(plan), "batch_tokens": args.batch_tokens,
                      "extracted": EXTRACTED}

    ex = {"plain": HFExtractor(plain, EXTRACTED, config.hidden_size, "bfloat16"),
          "device_map": HFExtractor(split, EXTRACTED, config.hidden_size, "bfloat16")}

    # States: every row of the first two batches, every captured layer, padding left out.
    diffs = {str(layer): 0.0 for layer in EXTRACTED}
    identical, within = True, True
    for batch in plan[:2]:
        rows = [ids_by_row[r] for r in batch]
        a, b = ex["plain"].forward(rows), ex["device_map"].forward(rows)
        for i, r in enumerate(batch):
            n = len(ids_by_row[r])
            for j, layer in enumerate(EXTRACTED):
                x, y = a[i, :n, j].float(), b[i, :n, j].float()
                diffs[str(layer)] = max(diffs[str(layer)], (x - y).abs().max().item())
                identical &= torch.equal(a[i, :n, j], b[i, :n, j])
                # bf16 tolerance: one part in 2^7 of the value, plus a small absolute floor
                within &= bool(torch.allclose(y, x, atol=1e-2, rtol=2**-7))
        del a, b
    record["states"] = {"rows_compared": sum(len(b) for b in plan[:2]), "max_abs_diff_per_layer": diffs,
                        "bitwise_identical": identical, "within_tolerance": within, "tolerance": "atol 1e-2, rtol 2^-7 (bf16)"}

    for name in ex:  # warm-up: one batch each
        run_all(ex[name], plan[:1], ids_by_row)
    times: dict[str, list[float]] = {"plain": [], "device_map": []}
    for k in range(args.rounds):
        for name in (("plain", "device_map") if k % 2 == 0 else ("device_map", "plain")):
            times[name].append(run_all(ex[name], plan, ids_by_row))
    record["tokens_per_s"] = {
        name: {"runs": [round(tokens / t) for t in ts], "min": round(tokens / max(ts)),
               "median": round(tokens / statistics.median(ts)), "max": round(tokens / min(ts))}
        for name, ts in times.items()
    }
    record["ratio_device_map_over_plain_median"] = round(
        record["tokens_per_s"]["device_map"]["median"] / record["tokens_per_s"]["plain"]["median"], 4)
    record["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    record_run.write_record(args.out / "device_map", record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
