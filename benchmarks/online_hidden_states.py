"""Online vs offline hidden states on the embedded default: wall time, training tokens/s,
validation loss, acceptance on the test split, side by side.

    python benchmarks/online_hidden_states.py ONLINE_WORKDIR OFFLINE_WORKDIR \
        --command "CMD" --out benchmarks/results/online_hidden_states [--loadavg LOG]

ONLINE_WORKDIR: a run with hidden_states.mode online (its train + evaluate jobs ran);
OFFLINE_WORKDIR: the offline run it was copied from (same prompts, answers, tokenized data,
vocab maps, config; its hidden-state shards, training and evaluation). Each side's figures come
from its own files: results/benchmarks/*.tsv (Snakemake's per-job wall time),
results/checkpoint/final/draftline_provenance.json (throughput: tokens over the seconds of the
Trainer's steps, fetch of the hidden states included; validation loss per epoch) and
results/eval/acceptance.json (test split, per-prompt bootstrap). LOG: "epoch-seconds load1 ..."
lines sampled during the online run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path


def _tsv_seconds(path: Path) -> float | None:
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    return round(float(lines[1].split("\t")[0]), 1) if len(lines) > 1 else None


def side(workdir: Path) -> dict:
    results = workdir / "results"
    bench = results / "benchmarks"
    final = json.loads((results / "checkpoint/final/draftline_provenance.json").read_text())
    acceptance = json.loads((results / "eval/acceptance.json").read_text())
    test = acceptance["sets"]["test"] if "sets" in acceptance else acceptance
    trained = test["drafts"]["trained"]
    shards = sorted(bench.glob("hidden_states/shard_*.tsv"))
    return {
        "workdir": str(workdir),
        "hidden_states": final.get("hidden_states", {"mode": "offline"}),
        "seconds": {
            "hidden_state_shards_sum": round(sum(_tsv_seconds(p) or 0 for p in shards), 1) if shards else 0.0,
            "hidden_state_shards_max": max((_tsv_seconds(p) or 0 for p in shards), default=0.0),
            "train": _tsv_seconds(bench / "train.tsv"),
            "evaluate": _tsv_seconds(bench / "evaluate.tsv"),
        },
        "train_threads": final.get("threads"),
        "num_workers": final.get("num_workers"),
        "throughput": final.get("throughput"),
        "val_loss_per_epoch": final.get("val_loss_per_epoch"),
        "chosen_epoch": final.get("chosen_epoch"),
        "test": {
            "prompts": test.get("prompts"),
            "mean_acceptance_length": trained["mean_acceptance_length"],
            "bootstrap_95": (trained.get("spread") or {}).get("bootstrap_95"),
            "acceptance_per_position": trained["acceptance_per_position"],
            "untrained_mean_acceptance_length": test["drafts"].get("untrained", {}).get("mean_acceptance_length"),
        },
        "commit": (json.loads((results / "checkpoint/final/provenance.json").read_text()).get("workflow") or {}).get("commit"),
    }


def _load(log: Path | None, start: float, end: float) -> dict | None:
    if log is None or not log.is_file():
        return None
    values = sorted(float(p[1]) for p in (line.split() for line in log.read_text().splitlines())
                    if len(p) > 1 and start <= float(p[0]) <= end)  # fmt: skip
    if not values:
        return None
    return {"samples": len(values), "load1_min": values[0], "load1_median": values[len(values) // 2], "load1_max": values[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("online", type=Path)
    parser.add_argument("offline", type=Path)
    parser.add_argument("--command", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--loadavg", type=Path)
    parser.add_argument("--note", default="")
    args = parser.parse_args()

    online, offline = side(args.online), side(args.offline)
    train_tsv = args.online / "results/benchmarks/train.tsv"
    end = train_tsv.stat().st_mtime if train_tsv.exists() else datetime.now().timestamp()
    evaluate_tsv = args.online / "results/benchmarks/evaluate.tsv"
    if evaluate_tsv.exists():
        end = max(end, evaluate_tsv.stat().st_mtime)
    start = end - (online["seconds"]["train"] or 0) - (online["seconds"]["evaluate"] or 0)
    versions = json.loads((args.online / "results/checkpoint/final/provenance.json").read_text()).get("versions")
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    record = {
        "command": args.command,
        "note": args.note,
        "versions": versions,
        "machine": {"cpu": cpu, "cores": os.cpu_count()},
        "load_during_online_run": _load(args.loadavg, start, end),
        "online": online,
        "offline": offline,
        "recorded": datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    path = Path(args.out)
    path.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")

    def row(name: str, s: dict) -> str:
        t, sec = s["throughput"] or {}, s["seconds"]
        hs = sec["hidden_state_shards_max"]
        total = (sec["train"] or 0) + hs
        b = s["test"]["bootstrap_95"]
        losses = " / ".join(f"{float(v):.2f}" for v in (s["val_loss_per_epoch"] or {}).values())
        return (
            f"| {name} | {hs:.0f} | {sec['train']:.0f} | {total:.0f} | {t.get('tokens_per_s', 0):.1f} | "
            f"{t.get('median_step_tokens_per_s', 0):.1f} | {losses} | {s['test']['mean_acceptance_length']:.3f} "
            f"{'[%.3f, %.3f]' % tuple(b) if b else ''} |"
        )

    load = record["load_during_online_run"]
    lines = [
        "| mode | hidden-state jobs s (longest shard) | train job s | hidden states + training s | training tokens/s (all steps) | median step tokens/s | val loss per epoch | test mean acceptance length [95% bootstrap] |",
        "|---|---|---|---|---|---|---|---|",
        row("offline", offline),
        row("online", online),
        "",
        f"Command: `{args.command}`; online commit {online['commit']}, offline commit {offline['commit']}; "
        f"machine {cpu} ({os.cpu_count()} cores)"
        + (f"; 1-minute load during the online run {load['load1_min']}-{load['load1_max']} (median {load['load1_median']})" if load else "")
        + ".",
    ]
    if args.note:
        lines += ["", args.note]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
