"""The training check's Trainer process: the train stage's own entry point
(`draftline.stages.train.entry`: speculators' Trainer with its CPU shims and metrics log), plus
what each rank records once its Trainer finished, as `rank_<RANK>.json` in
$DRAFTLINE_PREFLIGHT_RANKS: the process group's backend as speculators set it up (null: one
process, no group), the world size, and the rank's peak memory (torch.cuda.max_memory_allocated
on CUDA, the process's max RSS on the CPU).

    [torchrun --nproc_per_node N] -m draftline.preflight.training_entry <speculators train flags>
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

from draftline.preflight.training import RANKS_ENV


def record_backend(seen: dict) -> None:
    """Read the backend right after speculators sets up its process group (it destroys it at the end)."""
    import torch.distributed as dist

    from draftline.stages.train.speculators_patches import replace

    def maybe_setup_distributed(*args, **kwargs):
        real(*args, **kwargs)
        if dist.is_initialized():
            seen["backend"], seen["world_size"] = dist.get_backend(), dist.get_world_size()

    real = replace("speculators.train.cli:maybe_setup_distributed", maybe_setup_distributed)


def peak_memory() -> tuple[int, str]:
    """(bytes, how they were read) for this rank."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "max RSS"  # Linux: KiB


def main() -> None:
    from draftline.stages.train import entry

    seen: dict = {"backend": None, "world_size": 1}
    record_backend(seen)
    entry.main()
    rank = int(os.environ.get("RANK", "0"))
    peak, measure = peak_memory()
    folder = Path(os.environ[RANKS_ENV])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank_{rank}.json").write_text(json.dumps({
        "rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")), **seen,
        "peak_memory_bytes": peak, "memory_measure": measure,
    }) + "\n")


if __name__ == "__main__":
    main()
