"""What the estimate reads of a target: its Shape (from a Hugging Face config.json, `shape_of`), and
the shapes of the targets docs/sizing.md's tables show."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    """What the estimate needs from a target's config.json."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (the draft's layer uses it too)
    vocab: int
    experts: int = 0  # routed experts (0 = dense)
    experts_per_token: int = 0
    expert_intermediate: int = 0
    total_params: float | None = None  # for the weights' bytes; None = from the linear layers

    @property
    def attention_linear(self) -> int:
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def active_linear(self) -> float:
        """Weights each token multiplies through in the decoder layers (no embedding, no lm_head)."""
        if self.experts:
            mlp = self.experts_per_token * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts
        else:
            mlp = 3 * self.hidden * self.intermediate
        return self.layers * (self.attention_linear + mlp)

    @property
    def weights_bytes(self) -> float:
        if self.total_params:
            return 2 * self.total_params
        mlp = (self.experts * 3 * self.hidden * self.expert_intermediate) if self.experts else 3 * self.hidden * self.intermediate
        return 2 * (self.layers * (self.attention_linear + mlp) + 2 * self.vocab * self.hidden)

    def forward_flops(self, seq_len: int) -> float:
        """FLOPs per token of a forward over conversations of seq_len tokens (causal attention)."""
        return 2 * self.active_linear + 2 * self.layers * self.heads * self.head_dim * (seq_len + 1)

    def draft_linear(self, draft_vocab: int) -> float:
        """An EAGLE-3 draft layer (q, k, v read 2 x hidden), fc (3 x hidden -> hidden), lm_head."""
        h = self.hidden
        attention = 2 * h * (self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim) + self.heads * self.head_dim * h
        return attention + 3 * h * self.intermediate + 3 * h * h + h * draft_vocab


def shape_of(config_path: str | Path, name: str | None = None) -> Shape:
    """A Shape from a Hugging Face config.json (Llama, Qwen, Mistral style; MoE with num_experts
    or n_routed_experts)."""
    raw = json.loads(Path(config_path).read_text())
    c = {**raw, **raw.get("text_config", {})} if isinstance(raw.get("text_config"), dict) else raw
    heads = c["num_attention_heads"]
    experts = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts") or 0
    return Shape(
        name=name or Path(config_path).parent.name,
        layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=heads,
        kv_heads=c.get("num_key_value_heads") or heads, head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        intermediate=c.get("intermediate_size") or 4 * c["hidden_size"], vocab=c["vocab_size"],
        experts=experts, experts_per_token=c.get("num_experts_per_tok", 0) if experts else 0,
        expert_intermediate=c.get("moe_intermediate_size", 0) if experts else 0,
    )


# The targets of the docs' table (their published config.json values).
LLAMA_8B = Shape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256)
LLAMA_70B = Shape("Llama-3.3-70B", 80, 8192, 64, 8, 128, 28672, 128256)
# Weights from the linear layers, as the plan has them from the target's config.json (235.0e9 params).
QWEN3_235B = Shape("Qwen3-235B-A22B (MoE)", 94, 4096, 64, 4, 128, 12288, 151936, experts=128,
                   experts_per_token=8, expert_intermediate=1536)
SMOLLM2_135M = Shape("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152)
