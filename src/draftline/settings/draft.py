"""The draft and its training (`vocab:`, `draft:`, `train:`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from draftline.settings.fields import Block, Number, setting


class VocabBlock(Block):
    """The draft's reduced vocabulary."""

    draft_vocab_size: int = setting(
        32000, ge=2,
        description="Tokens in the draft vocabulary (the most frequent assistant tokens); at most the target's vocabulary.",
    )


class DraftBlock(Block):
    """Draft model kind and shape."""

    algorithm: Literal["eagle3", "dflash", "dflash2", "dspark", "peagle"] = setting(
        "eagle3",
        description=(
            "The draft algorithm, named as speculators' --speculator-type (draftline.algorithms): eagle3 = EAGLE-3, one token per draft "
            "forward pass, trained with train.ttt_steps test-time steps; dflash = DFlash, a block-diffusion draft proposing "
            "draft.block_size - 1 tokens per forward pass; dflash2 = DFlash with local convolutions and a candidate selector; dspark = "
            "DFlash with a Markov head, proposing draft.block_size tokens; peagle = P-EAGLE, an EAGLE-3 draft proposing all its tokens in "
            "one pass. All read the same hidden states; vLLM serves them (method eagle3 / dflash / dflash / dspark / eagle3 with "
            "parallel_drafting). speculators' mtp (the target's own MTP layers) and xpress are not served by the pinned vLLM."
        ),
    )
    block_size: int = setting(
        8, ge=2,
        description=(
            "dflash, dflash2, dspark: tokens per draft block (the anchor + block_size - 1 proposed tokens); speculators' own default is 16 "
            "for dflash, 8 for its other block drafts."
        ),
    )
    num_depths: int = setting(
        8, ge=2,
        description=(
            "peagle: the parallel depths trained (speculators' --num-depths, its default 8): the draft's proposal length in its config; "
            "vLLM serves up to evaluate.num_speculative_tokens of them."
        ),
    )
    num_layers: int = setting(
        1, ge=1,
        description=(
            "Decoder layers in the draft. A DSpark draft served by vLLM 0.26 (the default GPU lock) needs as many as its aux layers (3 by "
            "default): vLLM 0.26 sizes its fc by them; the plan says so."
        ),
    )
    sample_from_anchor: bool | None = setting(
        None,
        description=(
            "dspark: whether a block's first position (the anchor) proposes a token too (true: draft.block_size proposed tokens) or is the "
            "verified bonus token (false: block_size - 1), speculators' --sample-from-anchor; null = speculators' default, true. It must "
            "be how the serving vLLM reads a DSpark draft: vLLM 0.32 reads it from the draft's config, vLLM 0.26 (the default GPU lock) "
            "serves every speculators DSpark draft as false. Evaluation checks this before it loads an engine. (DFlash and DFlash2 are "
            "always false: vLLM serves them only so.)"
        ),
    )


class TrainBlock(Block):
    """speculators' Trainer settings."""

    epochs: int = setting(3, ge=1, description="Training epochs.")
    lr: Number = setting(0.001, gt=0, description="Peak learning rate (speculators' own default; linear decay after a short warm-up).")
    optimizer: Literal["auto", "adamw", "muon"] = setting(
        "auto",
        description="auto = AdamW on CPU (Muon is ~8x slower without bf16), speculators' default Muon on CUDA.",
    )
    total_seq_len: int = setting(
        4096, ge=16,
        description=(
            "Tokens packed into one training batch (per GPU). speculators' sampler cuts a conversation longer than this to its first "
            "total_seq_len tokens, so the plan stops when it is below tokenize.max_seq_len unless allow_truncated_samples is true."
        ),
    )
    allow_truncated_samples: bool = setting(
        False,
        description=(
            "Accept train.total_seq_len below tokenize.max_seq_len: conversations longer than total_seq_len are then trained on their "
            "first total_seq_len tokens only (counted in the checkpoint's provenance and results/summary.md). false: the plan stops, "
            "naming both keys."
        ),
    )
    train_fraction: Number = setting(
        0.9, gt=0, le=1,
        description=(
            "Share of rows used for training; the rest is the validation split that picks the best epoch (1.0 = no validation, last epoch "
            "wins)."
        ),
    )
    ttt_steps: int = setting(3, ge=1, description="Test-time-training steps (draft positions trained per step).")
    seed: int = setting(0, description="Training seed.")
    fsdp: bool = setting(
        False,
        description=(
            "Shard the draft's parameters across the job's GPUs with FSDP (speculators --fsdp-shard) instead of replicating them; for "
            "drafts too big for one GPU. Ignored on the CPU."
        ),
    )
    num_workers: Literal["auto"] | Annotated[int, Field(ge=0)] = setting(
        "auto",
        description=(
            "Data-loader worker processes per training process; auto = 0 on the CPU (they would compete with torch for the same cores; 2 "
            "with hidden_states.mode online, where they mostly wait on the server), 4 on CUDA. Not part of the run key, so changing it "
            "resumes."
        ),
    )
    keep_old_runs: bool = setting(
        False,
        description=(
            "Keep results/checkpoint/runs/<key> folders of earlier settings or inputs after final/ is published (each holds every epoch "
            "with optimizer state); false removes them."
        ),
    )
    checkpoint_freq: Number = setting(
        1, gt=0, le=1,
        description=(
            "How often training saves a resumable checkpoint, as a fraction of an epoch (speculators' --checkpoint-freq): 1 = at the end "
            "of each epoch only; 0.05 = every twentieth of an epoch, so a preempted or timed-out job resumes mid-epoch from the last one "
            "(each save writes the draft and its optimizer state into the epoch's folder). Not part of the run key: changing it resumes."
        ),
    )


# What `auto` means for train.num_workers and train.optimizer on the planned device: the plan
# resolves them once (draftline.planning.rule_params.resolved_settings), the train job alike.
CUDA_NUM_WORKERS = 4


def resolve_num_workers(requested: int | str, cuda: bool, online: bool = False) -> int:
    # On CPU the workers would compete with torch's threads for the same cores; on CUDA the
    # batch fetch is ~28% of a step without them (docs/gpu.md). Online hidden states on CPU:
    # the workers mostly wait on the server, and with them its requests overlap the steps and
    # each other (the server batches them); without them the Trainer idles while it waits.
    if requested == "auto":
        return CUDA_NUM_WORKERS if cuda else (ONLINE_CPU_NUM_WORKERS if online else 0)
    return int(requested)


ONLINE_CPU_NUM_WORKERS = 2


def resolve_optimizer(requested: str, cuda: bool) -> str:
    # Muon is ~8x slower on CPUs without bf16 (torch's Muon casts gradients to bf16).
    if requested == "auto":
        return "muon" if cuda else "adamw"
    return requested
