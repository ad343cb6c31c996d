"""Run the real workflow (Snakefile in this repo) in a scratch folder, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def write_config(workdir: Path, config: dict) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    return path


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 1800) -> subprocess.CompletedProcess:
    """`snakemake` on this repo's Snakefile with `workdir` as its working directory."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [
        SNAKEMAKE,
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--configfile", str(workdir / "config.yaml"),
        *args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stdout[-5000:]}\n{result.stderr[-8000:]}"
        )
    return result


def planned_jobs(workdir: Path, *targets: str, extra: tuple[str, ...] = ()) -> dict[str, int]:
    """Rule name -> job count from a dry run's 'Job stats' table ({} when nothing is planned)."""
    out = snakemake(workdir, "-n", *extra, *targets)
    lines = (out.stdout + out.stderr).splitlines()
    counts: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line.split()[:2] == ["job", "count"]:
            for row in lines[i + 2 :]:
                parts = row.split()
                if len(parts) != 2 or parts[0] == "total":
                    break
                counts[parts[0]] = int(parts[1])
            break
    counts.pop("all", None)
    return counts
