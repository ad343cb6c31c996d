"""What speculators' Trainer leaves out of training without a count: its batch sampler
(speculators 0.9.0 `train.distributed_batch_sampler.MultipackDistributedBatchSamplerV2`)

- cuts every sample longer than train.total_seq_len to its first total_seq_len tokens (it warns
  once, "These samples will be truncated", with no count in any record), and
- packs each epoch's shuffled samples into one batch per data-parallel rank at a time, and drops
  the samples left when fewer remain than ranks (up to world_size - 1 per epoch; none with one
  process).

Counted here with that same sampler, on the dataset's `seq_len` column split as the Trainer
splits it (`--train-data-ratio`: the first int(rows x ratio) rows train), for every epoch and
rank, with the seeds the Trainer gives it (training: train.seed + epoch; validation: 0 + epoch).
"""

from __future__ import annotations

import warnings
from pathlib import Path


def dropped_samples(dataset_dir: str | Path, total_seq_len: int, train_ratio: float, world_size: int,
                    epochs: int, seed: int) -> dict:
    """{"training": ..., "validation": ...}, each with its `samples`, the `truncated` ones (longer
    than total_seq_len), the tokens cut off them, and the samples `left_over` in each epoch."""
    from datasets import load_from_disk

    lengths = [int(n) for n in load_from_disk(str(dataset_dir)).with_format(None)["seq_len"]]
    split = int(len(lengths) * train_ratio)
    out: dict = {"total_seq_len": total_seq_len, "world_size": world_size, "epochs": epochs}
    for name, part, part_seed in (("training", lengths[:split], seed), ("validation", lengths[split:], 0)):
        long = [n for n in part if n > total_seq_len]
        out[name] = {
            "samples": len(part),
            "truncated": len(long),
            "truncated_tokens": sum(n - total_seq_len for n in long),
            "left_over_per_epoch": [left_over(part, total_seq_len, world_size, part_seed, e) for e in range(epochs)],
        }
    return out


def left_over(lengths: list[int], total_seq_len: int, world_size: int, seed: int, epoch: int) -> int:
    """Samples that no rank's batches hold in `epoch` (speculators' sampler, every rank)."""
    if not lengths:
        return 0
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    covered: set[int] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its truncation warning: counted by dropped_samples
        for rank in range(world_size):
            sampler = MultipackDistributedBatchSamplerV2(total_seq_len, lengths, world_size, rank, seed=seed)
            sampler.set_epoch(epoch)
            for batch in sampler:
                covered.update(int(i) for i in batch)
    return len(lengths) - len(covered)


def dropped_count(dropped: dict) -> int:
    """Samples cut or left out anywhere (0: the Trainer sees every token of every sample)."""
    return sum(part["truncated"] + sum(part["left_over_per_epoch"]) for part in
               (dropped["training"], dropped["validation"]))


def describe(dropped: dict) -> str:
    """One line for the log and the summary."""
    train, val = dropped["training"], dropped["validation"]
    return (
        f"samples cut at train.total_seq_len ({dropped['total_seq_len']} tokens): {train['truncated']} of "
        f"{train['samples']} in training ({train['truncated_tokens']:,} tokens never trained on), "
        f"{val['truncated']} of {val['samples']} in validation; left out per epoch (fewer left than the "
        f"{dropped['world_size']} training process(es)): training {train['left_over_per_epoch']}, "
        f"validation {val['left_over_per_epoch']}"
    )
