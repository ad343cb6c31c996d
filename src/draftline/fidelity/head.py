"""The target's own head: its final norm and lm_head, read from the shard(s) holding them
(read_head -> TargetHead), which turn the stored last layer into next-token logits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftline.fidelity.settings import FidelityError

# Final norm of the target, by (text) config model_type: x / rms(x) * w ...
RMS_NORM = frozenset({
    "llama", "mistral", "mixtral", "ministral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "deepseek_v2", "deepseek_v3", "phi3", "olmo2", "smollm3", "granite", "granitemoe", "gpt_oss",
    "llama4_text", "glm4", "glm4_moe",
})
# ... or x / rms(x) * (1 + w) (Gemma's, Qwen3-Next's zero-centred weight)
RMS_NORM_ONE_PLUS = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "qwen3_next"})


@dataclass
class TargetHead:
    """The target's final norm and lm_head: what turns its last layer into next-token logits."""

    norm_weight: object  # torch.Tensor [hidden]
    lm_head: object  # torch.Tensor [vocab, hidden] (the input embedding when tied)
    eps: float
    norm_kind: str  # "rms" (x / rms * w) or "rms_one_plus" (x / rms * (1 + w))
    model_type: str
    tied: bool
    source: str  # the target folder

    def logits(self, last):
        """Next-token logits (float32) of states `last` [tokens, hidden]."""
        import torch

        x = last.to(self.lm_head.device, torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        w = self.norm_weight.float()
        x = x * (1.0 + w if self.norm_kind == "rms_one_plus" else w)
        return x @ self.lm_head.T


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def read_head(target_dir: str | Path, trust_remote_code: bool = False) -> TargetHead:
    """The target's final norm weight and lm_head (the input embedding when
    tie_word_embeddings), read with speculators' `load_model_layers` (only the safetensors
    shard(s) holding them, as model.safetensors.index.json maps them), on the GPU when there is one.

    Refuses (FidelityError naming the model_type) a target whose final norm is not one of the
    RMSNorms above, rather than guess. `trust_remote_code` is only for a config that needs it."""
    import torch
    from speculators.utils.loading import load_model_layers

    folder = Path(target_dir)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise FidelityError(f"{folder}/config.json: cannot read the target's config ({err})") from err
    text = _text_config(config)
    model_type = str(text.get("model_type") or config.get("model_type"))
    if model_type in RMS_NORM:
        kind = "rms"
    elif model_type in RMS_NORM_ONE_PLUS:
        kind = "rms_one_plus"
    else:
        raise FidelityError(
            f"{folder}: the hidden-state fidelity check knows the final norm of "
            f"{', '.join(sorted(RMS_NORM | RMS_NORM_ONE_PLUS))}, not model_type {model_type!r}; "
            "rather than guess it, set hidden_states.fidelity.rows: 0 to extract without the check "
            "(and report the model type, so its norm can be added)"
        )
    eps = text.get("rms_norm_eps", config.get("rms_norm_eps"))
    if eps is None:
        raise FidelityError(f"{folder}/config.json: no rms_norm_eps for the final {model_type} RMSNorm")
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    head_name = "embed_tokens.weight" if tied else "lm_head.weight"
    try:
        tensors = load_model_layers(["model.norm.weight", head_name], str(folder))
    except (OSError, ValueError) as err:
        raise FidelityError(f"{folder}: cannot read the final norm and {head_name} ({err})") from err
    missing = [n for n in ("model.norm.weight", head_name) if n not in tensors]
    if missing:
        raise FidelityError(
            f"{folder}: the safetensors hold no {' or '.join(missing)} (tie_word_embeddings {tied}); "
            "set hidden_states.fidelity.rows: 0 to extract without the check"
        )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    norm, head = tensors["model.norm.weight"], tensors[head_name]
    hidden = int(text.get("hidden_size", norm.shape[-1]))
    if norm.shape != (hidden,) or head.ndim != 2 or head.shape[1] != hidden:
        raise FidelityError(
            f"{folder}: final norm {tuple(norm.shape)} and {head_name} {tuple(head.shape)} do not fit "
            f"hidden_size {hidden}"
        )
    return TargetHead(norm.to(device, torch.float32), head.to(device, torch.float32), float(eps), kind,
                      model_type, tied, str(folder))
