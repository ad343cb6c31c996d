"""The target's hidden states the draft trains on (`hidden_states:` and its `fidelity:` check)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, Field

from draftline.settings.fields import Block, Number, block, number, setting


def _unique(ids: list[int]) -> list[int]:
    if len(set(ids)) != len(ids):
        raise ValueError(f"{ids} names a layer twice")
    return ids


# How hidden-state files are stored (hidden_states.format): its values, in one place.
HiddenStateFormat = Literal["full", "fp8"]
FORMATS: tuple[str, ...] = get_args(HiddenStateFormat)

# Target layers by number (1 = the first decoder layer's output), each once.
LayerIds = Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1, json_schema_extra={"uniqueItems": True}),
                     AfterValidator(_unique)]


class FidelityBlock(Block):
    """A check that the stored hidden states are the target's, before training (docs/gpu.md, "Hidden-state
    fidelity"): the target's own final norm + lm_head (read alone from its safetensors) applied to the stored
    last layer of a few rows must predict their next tokens on assistant positions, and no stored layer may
    be all zero, one state for every token or a copy of another. Offline it runs in every extraction shard
    before the shard is published (a failing shard publishes nothing and the run stops before training);
    online, on rows the train job's server makes before the Trainer starts. The figures go into the shard
    manifests, the checkpoint's provenance and results/summary.md.
    """

    rows: int = setting(
        8, ge=0,
        description=(
            "Rows checked per shard (spread evenly over it, the same rows every run; online: over the dataset); 0 = no check (for a target "
            "whose final norm the check does not know)."
        ),
    )
    min_top1: Literal["auto"] | number(ge=0, le=1) = setting(
        "auto",
        description=(
            "Lowest top-1 agreement on assistant positions that passes. auto = 0.8 for greedy regenerated answers (regenerate.enabled, "
            "temperature 0: the answers are the target's own top-1 tokens, re-tokenized; right states agreed 0.98-0.99 on the embedded "
            "target, the layer below the last in its place 0.50-0.70, zeros or another row's states under 0.05; a random test model whose "
            "output re-tokenizes into other tokens needs a lower bar) and 0.2 for the dataset's own answers (regenerate.enabled false) or "
            "sampled ones (temperature > 0), which right states predict less often (figures: benchmarks/results/hidden_state_fidelity.md); "
            "or a number in [0, 1] (0 keeps only the layer checks). The bar gates publishing: changing it reruns no published shard, and a "
            "failed shard re-checks its staged states under the new bar without extracting them again."
        ),
    )
    recompute_rows: int = setting(
        2, ge=0,
        description=(
            "Of the checked rows, how many are recomputed by a plain transformers forward of the target (float32, offline extraction) and "
            "compared layer by layer with the stored states (relative difference at most 0.1, and nearest the forward's layer of the same "
            "id). Needs no answers: it catches an off-by-one last layer that the agreement bar lets pass with the dataset's own answers "
            "(measured relative difference 1.00 on the embedded target, 0.41 on the tiny test model; right states 0). Targets whose "
            "safetensors exceed 4 GiB, or that transformers cannot load, are not recomputed (the manifest's `recomputed.skipped` says "
            "why). 0 = no recompute."
        ),
    )


class HiddenStatesBlock(Block):
    """Target hidden states the draft trains on."""

    layer_ids: Literal["auto"] | LayerIds = setting(
        "auto",
        description=(
            'Auxiliary target layers fed to the draft; "auto" = speculators\' default for the target\'s depth ([2, n//2, n-3]). The last '
            "layer is always captured as well."
        ),
    )
    shards: int = setting(2, ge=1, description="Number of extraction jobs (each its own GPU job); rows are split evenly.")
    backend: Literal["vllm", "transformers"] = setting(
        "vllm",
        description=(
            "Extraction engine: vllm (its extract_hidden_states method), or transformers (a batched forward with output_hidden_states; for "
            "machines without vLLM, and as a cross-check). Both write the same files in the same layer convention."
        ),
    )
    format: HiddenStateFormat = setting(
        "full",
        description=(
            "How hidden-state files are stored: full (the extraction dtype: float32 on CPU, bfloat16 on CUDA) or fp8 (speculators' own FP8 "
            "layout: float8_e4m3fn with one float32 scale per token, written by its FP8 connector or quantizer and read back by its "
            "Trainer's `--hidden-states-backend fp8`); fp8 takes 1/4 of float32's disk and 1/2 of bfloat16's. A change re-extracts the "
            "hidden states and reruns training and what follows."
        ),
    )
    fidelity: FidelityBlock = block(FidelityBlock)
    release_after_training: bool = setting(
        False,
        description=(
            "Delete the hidden-state shards and the training view (Snakemake temp()) once training and the disk plot have read them. Saves "
            "their disk; the cost: anything that needs them again (a change of a training setting, a lost checkpoint) re-extracts every "
            "shard first."
        ),
    )
    max_disk_gb: number(gt=0) | None = setting(
        None,
        description=(
            "Stop before extraction when the hidden states would take more than this many GB (estimated after tokenization: tokens x "
            "layers x hidden size x dtype bytes, written to results/hidden_states/disk_estimate.json); null = no limit."
        ),
    )
    mode: Literal["offline", "online"] = setting(
        "offline",
        description=(
            "offline: extract every row's hidden states to disk first (shard jobs), then train on the files. online: the train job starts "
            "a vLLM server for the target with hidden-state extraction and speculators' Trainer asks it for each sample as it loads it "
            "(--on-missing generate); nothing is kept on disk, but every epoch recomputes the target's forward pass "
            '(docs/hidden-states.md, "Offline or online hidden states").'
        ),
    )
    online_server_gpus: int = setting(
        1, ge=0,
        description=(
            "mode online on CUDA: how many of the train job's GPUs the vLLM server takes (the first ones of CUDA_VISIBLE_DEVICES, tensor "
            "parallel over them); the Trainer runs on the rest, so the train job needs at least this many plus one. 0: the server shares "
            "the Trainer's first GPU(s) (a one-GPU machine; set vllm.gpu_memory_utilization to the server's share, e.g. 0.3, leaving the "
            "rest to the Trainer). On CPU the server takes half the job's threads (at least one) and the Trainer the rest."
        ),
    )
    online_server_timeout_s: Number = setting(
        900, gt=0,
        description=(
            "mode online: seconds to wait for the vLLM server to answer before the train job stops (the error names the server's log, "
            "logs/train_vllm_server.log)."
        ),
    )
    online_max_skipped_samples: int = setting(
        0, ge=0,
        description=(
            "mode online: how many samples speculators' Trainer may skip, over all epochs, because the server gave no hidden states for "
            "them after speculators' retries (each skipped load counts: a sample skipped in two epochs counts twice). The count is "
            "recorded in the checkpoint's draftline_provenance.json and results/summary.md; a run that skips more fails before publishing, "
            "naming the count. Its finished epochs are kept, so raising this to the count and rerunning publishes without training again. "
            "Not part of the run key and no rule param: changing it reruns nothing once a run is published. (Offline, every file is "
            "checked before training, so no sample is skipped.)"
        ),
    )
