"""What every job runs with, whatever its stage: vLLM engines and their settings (`vllm_engine`),
the GPUs a job may use (`devices`) and what the NVIDIA driver says of them (`nvidia`), atomic
publishing of outputs (`atomic`), the job's log (`logs`) and which shard of a sharded stage a job
is (`shards`); and the PYTHONPATH of the processes a job starts (below)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2])  # the folder that holds the draftline package


def pythonpath_with_draftline(env: Mapping[str, str]) -> str:
    """PYTHONPATH for a Python process a job starts (the trainer's ranks, the online server, vLLM's
    own subprocesses): `env`'s with draftline's folder first. A job finds draftline on the sys.path
    Snakemake hands it (rules/common.smk), which a new process does not inherit: nothing installs
    draftline."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([SRC, *(p for p in paths if p != SRC)])
