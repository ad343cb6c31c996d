"""What a config costs before it runs: GPU-hours per stage and hidden-state bytes, from the number of
training conversations and the configured lengths (an upper bound: every conversation is taken as
`tokenize.max_seq_len` tokens, every user turn answered at `regenerate.max_new_tokens`).

- shapes: what the estimate reads of a target (Shape, shape_of) and the docs' targets
- estimate: the rates (measured, scaled or assumed; GPUS) and `estimate()` of a Plan on a Shape
- inputs: a validated config's Plan and count of training conversations, the train job's GPUs
- line: the plan's one-line estimate (for_config, describe)
- tables: docs/sizing.md's tables, the recipes' among them
  (`PYTHONPATH=src python -m draftline.planning.sizing` prints them: __main__)
"""

from draftline.planning.sizing.estimate import (
    CPU,
    DECODE_FRACTION,
    DRAFT_LINEAR_8B,
    EXPECTED_SHARE,
    EXTRACTION_FRACTION,
    GPUS,
    H200_MATMUL_FLOPS,
    LOAD_BYTES_PER_S,
    SPECULATIVE_SPEEDUP,
    START_S,
    TRAIN_TOKENS_PER_S_8B,
    VLLM_START_S,
    Gpu,
    Plan,
    estimate,
    regenerated_tokens,
    vllm_start_s,
)
from draftline.planning.sizing.inputs import (
    DTYPE_BYTES,
    config_estimate,
    gpu_overrides,
    named_set_prompts,
    plan_from_config,
    planned_train_gpus,
    planned_training_rows,
    planned_user_turns,
)
from draftline.planning.sizing.line import SizedTarget, describe, for_config
from draftline.planning.sizing.shapes import LLAMA_8B, LLAMA_70B, QWEN3_235B, SMOLLM2_135M, Shape, shape_of
from draftline.planning.sizing.tables import (
    RECIPES,
    Recipe,
    docs_tables,
    recipe_config,
    recipe_estimates,
    recipe_train_gpus,
    recipes_table,
    table,
)

__all__ = [
    "CPU", "DECODE_FRACTION", "DRAFT_LINEAR_8B", "DTYPE_BYTES", "EXPECTED_SHARE", "EXTRACTION_FRACTION", "GPUS",
    "H200_MATMUL_FLOPS", "LLAMA_8B", "LLAMA_70B", "LOAD_BYTES_PER_S", "QWEN3_235B", "RECIPES", "SMOLLM2_135M",
    "SPECULATIVE_SPEEDUP", "START_S", "TRAIN_TOKENS_PER_S_8B", "VLLM_START_S", "Gpu", "Plan", "Recipe", "Shape", "SizedTarget",
    "config_estimate", "describe", "docs_tables", "estimate", "for_config", "gpu_overrides", "named_set_prompts",
    "plan_from_config", "planned_train_gpus", "planned_training_rows", "planned_user_turns", "recipe_config",
    "recipe_estimates", "recipe_train_gpus", "recipes_table", "regenerated_tokens", "shape_of", "table",
    "vllm_start_s",
]
