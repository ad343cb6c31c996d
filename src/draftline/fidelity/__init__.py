"""Hidden-state fidelity: are the stored states the target's own, checked before training.

Nothing in speculators or vLLM checks this (their validation checks token ids, shapes and finite
values, not that the states are the target's): a wrong layer, states copied across layers by a
tensor-parallel bug, zeros or another row's states all pass it and train a useless draft.

The check reads the target's own head, only its final norm and its lm_head (`read_head`: the
shard(s) holding those two tensors, a small read even for a 470 GB MoE), applies it to the stored
last layer (vLLM's id num_hidden_layers: the un-normed output of the last decoder layer) of a few
rows, and measures how often its top-1 token is the row's next token (`measure`):

- on assistant positions (those whose next token has loss_mask 1): with greedy regenerated
  answers these tokens ARE the target's top-1 choices, so agreement is near 1 when the states are
  right (0.988 on the embedded default, benchmarks/results/hidden_state_fidelity.md) and far
  lower when the last layer is wrong;
- on all positions (prompts included: text the target did not write), for the record;
- per stored layer (aux layers and the last): not all zero, not the same state for every token,
  and distinct from every other stored layer (relative difference of each pair).

`check` stops on a failure with what failed, where and what to do (`FidelityError`). The bar
(`hidden_states.fidelity.min_top1`) depends on where the answers came from (`resolve_min_top1`).

One module per part of the check:
- settings: what the check is given (FidelitySettings, the `auto` bar: resolve_min_top1, the rows
  it reads: sample_rows) and what it raises (FidelityError)
- head: the target's final norm and lm_head (read_head -> TargetHead)
- measure: the head's top-1 agreement and each stored layer's figures (measure, layer_stats)
- recompute: a plain transformers forward of a few rows, layer by layer (recompute)
- check: the verdicts on those figures (check, check_recompute)
- record: what a manifest or provenance keeps (record) and one figure over the shards (combine)
"""

from draftline.fidelity.check import MIN_LAYER_DIFFERENCE, MIN_TOKEN_SPREAD, check, check_recompute
from draftline.fidelity.head import RMS_NORM, RMS_NORM_ONE_PLUS, TargetHead, read_head
from draftline.fidelity.measure import TOKENS_PER_MATMUL, Sample, layer_stats, measure
from draftline.fidelity.recompute import RECOMPUTE_MAX_BYTES, RECOMPUTE_TOLERANCE, recompute
from draftline.fidelity.record import combine, record
from draftline.fidelity.settings import (
    AUTO_MIN_TOP1_GREEDY,
    AUTO_MIN_TOP1_OTHER,
    FidelityError,
    FidelitySettings,
    resolve_min_top1,
    sample_rows,
)

__all__ = [
    "AUTO_MIN_TOP1_GREEDY", "AUTO_MIN_TOP1_OTHER", "MIN_LAYER_DIFFERENCE", "MIN_TOKEN_SPREAD", "RECOMPUTE_MAX_BYTES",
    "RECOMPUTE_TOLERANCE", "RMS_NORM", "RMS_NORM_ONE_PLUS", "TOKENS_PER_MATMUL", "FidelityError", "FidelitySettings",
    "Sample", "TargetHead", "check", "check_recompute", "combine", "layer_stats", "measure", "read_head", "recompute",
    "record", "resolve_min_top1", "sample_rows",
]
