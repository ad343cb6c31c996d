"""OpenMP's wait policy when two processes share the cores, as the test suite's two workers do.

Each process runs the same torch loop (a SmolLM2-sized MLP on 64 tokens) with as many threads as
the machine has cores, the way each worker's jobs take `--cores 2`. Rounds alternate libgomp's
default (threads spin while they wait) and OMP_WAIT_POLICY=PASSIVE (they sleep), two processes
side by side and one alone; the ratio PASSIVE / default is taken round by round.

    PYTHONPATH=src .venv/bin/python benchmarks/omp_wait_policy.py --rounds 3 --out benchmarks/results/omp_wait_policy
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from record_run import header, header_line, summarize, this_command, write_record

LOOP = """
import torch
torch.set_num_threads({threads})
x, w, w2 = torch.randn(64, 576), torch.randn(576, 1536), torch.randn(1536, 576)
for _ in range({steps}):
    x = torch.nn.functional.layer_norm(torch.nn.functional.silu(x @ w) @ w2, (576,))
"""


def side_by_side(processes: int, policy: str | None, steps: int) -> float:
    """Wall seconds until `processes` copies of the loop, started together, have all ended."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | ({"OMP_WAIT_POLICY": policy} if policy else {})
    code = LOOP.format(threads=os.cpu_count(), steps=steps)
    started = time.monotonic()
    for p in [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(processes)]:
        p.wait()
    return round(time.monotonic() - started, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    record = header(this_command(), packages=("torch",))
    rows = {}
    for processes in (2, 1):
        seconds = {"default": [], "PASSIVE": []}
        for _ in range(args.rounds):
            for policy in ("default", "PASSIVE"):
                seconds[policy].append(side_by_side(processes, None if policy == "default" else policy, args.steps))
        ratios = [round(p / d, 3) for p, d in zip(seconds["PASSIVE"], seconds["default"], strict=True)]
        rows[processes] = {name: summarize(v) for name, v in seconds.items()} | {"ratio_passive_to_default": summarize(ratios)}
    record |= {"threads_per_process": os.cpu_count(), "steps": args.steps, "processes": rows}
    lines = ["# OpenMP's wait policy with two processes on the same cores", "",
             f"Each process: torch with {os.cpu_count()} threads, {args.steps} steps of a 576 -> 1536 -> 576 MLP on 64 tokens; "
             f"{args.rounds} rounds, default and PASSIVE in turn.", "",
             "| processes side by side | default s (min / median / max) | PASSIVE s | PASSIVE / default, paired (min / median / max) |",
             "|---|---|---|---|"]
    for processes, row in rows.items():
        cells = [" / ".join(str(row[k][s]) for s in ("min", "median", "max")) for k in ("default", "PASSIVE", "ratio_passive_to_default")]
        lines.append(f"| {processes} | " + " | ".join(cells) + " |")
    lines += ["", "min / median / max over the rounds: a range, not an interval."]
    write_record(args.out, record, "\n".join(lines) + "\n\n" + header_line(record))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
