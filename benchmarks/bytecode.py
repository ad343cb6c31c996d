"""Import time of the stack from bytecode against from source, paired in one run.

    python benchmarks/bytecode.py VENV_WITH_BYTECODE VENV_WITHOUT [--runs 5] [--module speculators]

Two environments built from the same lock (requirements/cpu.lock.txt), one by `./draftline`
(uv's --compile-bytecode) and one without; each run a fresh `python -c "import MODULE"` with
PYTHONDONTWRITEBYTECODE=1, as CI's machine sets it (so the one without never gains bytecode).
Alternating A B A B ... after one warm-up each; prints each side's wall seconds (min / median /
max) and the paired ratio. Record: benchmarks/results/bytecode.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time


def one(venv: str, module: str) -> float:
    start = time.time()
    subprocess.run([os.path.join(venv, "bin", "python"), "-c", f"import {module}"], check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True)
    return time.time() - start


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("with_bytecode")
    parser.add_argument("without")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--module", default="speculators")
    args = parser.parse_args()
    a, b = [], []
    for i in range(args.runs + 1):
        x, y = one(args.with_bytecode, args.module), one(args.without, args.module)
        print(f"{'warm-up' if i == 0 else f'run {i}'}: with bytecode {x:.2f} s, from source {y:.2f} s", flush=True)
        if i:
            a.append(x)
            b.append(y)
    print(f"import {args.module}: with bytecode {spread(a)} s, from source {spread(b)} s (min / median / max)")
    print(f"ratio with / without, pair by pair: {spread([x / y for x, y in zip(a, b)])}")


if __name__ == "__main__":
    main()
