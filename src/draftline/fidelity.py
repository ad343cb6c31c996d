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
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# `auto` bars for hidden_states.fidelity.min_top1, from benchmarks/results/hidden_state_fidelity.md
# (docs/gpu.md, "Hidden-state fidelity", says which failures each catches)
AUTO_MIN_TOP1_GREEDY = 0.8  # greedy regenerated answers: the target's own top-1 tokens (re-tokenized)
AUTO_MIN_TOP1_OTHER = 0.2  # the dataset's own answers, or answers sampled at temperature > 0
# A stored layer closer than this (relative difference) to another stored layer is a copy of it.
MIN_LAYER_DIFFERENCE = 1e-3
# A layer whose per-feature spread over tokens is below this share of its RMS is one state for all tokens.
MIN_TOKEN_SPREAD = 1e-4
TOKENS_PER_MATMUL = 512  # bounds the logits held at once (tokens x vocab floats)

# Final norm of the target, by (text) config model_type: x / rms(x) * w ...
RMS_NORM = frozenset({
    "llama", "mistral", "mixtral", "ministral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "deepseek_v2", "deepseek_v3", "phi3", "olmo2", "smollm3", "granite", "granitemoe", "gpt_oss",
    "llama4_text", "glm4", "glm4_moe",
})
# ... or x / rms(x) * (1 + w) (Gemma's, Qwen3-Next's zero-centred weight)
RMS_NORM_ONE_PLUS = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "qwen3_next"})


class FidelityError(ValueError):
    """Stored hidden states that are not the target's (or a target whose head cannot be read)."""


@dataclass(frozen=True)
class FidelitySettings:
    """`hidden_states.fidelity`, its `auto` bar resolved (`resolve_min_top1`): what the rules pass."""

    rows: int = 8  # rows measured per shard (0 = no check)
    min_top1: float = AUTO_MIN_TOP1_GREEDY
    basis: str = "greedy regenerated answers"  # why this bar (shown in errors and the summary)
    recompute_rows: int = 2  # of those, rows recomputed by a plain forward (`recompute`; 0 = none)

    @classmethod
    def from_param(cls, param: dict | None) -> FidelitySettings:
        return cls(**param) if param else cls(rows=0)


def resolve_min_top1(value, regenerate_enabled: bool, temperature: float) -> tuple[float, str]:
    """The bar for `hidden_states.fidelity.min_top1` and where it comes from. `auto`: greedy
    regenerated answers are the target's own top-1 tokens (a high bar); the dataset's own answers
    or sampled ones are not, so only a lower bar separates right states from wrong ones there."""
    if value != "auto":
        return float(value), "set in hidden_states.fidelity.min_top1"
    if not regenerate_enabled:
        return AUTO_MIN_TOP1_OTHER, "auto: the dataset's own answers (regenerate.enabled false)"
    if temperature > 0:
        return AUTO_MIN_TOP1_OTHER, f"auto: answers sampled at regenerate.temperature {temperature}"
    return AUTO_MIN_TOP1_GREEDY, "auto: greedy regenerated answers"


def sample_rows(rows: Sequence[int], n: int) -> list[int]:
    """`n` rows spread evenly over `rows` (the middle of each of n equal parts): deterministic,
    and not only the first rows of a shard."""
    rows = list(rows)
    if n >= len(rows):
        return rows
    return [rows[(2 * i + 1) * len(rows) // (2 * n)] for i in range(n)]


# ---------------------------------------------------------------- the target's head


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


# ---------------------------------------------------------------- measure


@dataclass(frozen=True)
class Sample:
    """One dataset row's stored states [seq, n_layers, hidden] (float, fp8 dequantized)."""

    row: int
    hidden_states: object
    token_ids: Sequence[int]
    loss_mask: Sequence[int]


def measure(head: TargetHead, samples: Sequence, extracted: Sequence[int]) -> dict:
    """Top-1 agreement of the target's head on the last stored layer with each row's next token
    (assistant positions and all), and per stored layer its scale, spread over tokens and nearest
    other layer. `samples` are `Sample`s or (row, hidden_states, token_ids, loss_mask) tuples."""
    import torch

    samples = [s if isinstance(s, Sample) else Sample(*s) for s in samples]
    extracted = [int(i) for i in extracted]
    hits = {"assistant": 0, "all": 0}
    counts = {"assistant": 0, "all": 0}
    nll_assistant = 0.0
    per_row = []
    stacked = []
    for s in samples:
        states = torch.as_tensor(s.hidden_states).float()
        if states.ndim != 3 or states.shape[1] != len(extracted):
            raise FidelityError(
                f"dataset row {s.row}: hidden_states {tuple(states.shape)} do not hold the {len(extracted)} "
                f"layers {extracted}"
            )
        ids = torch.as_tensor(list(s.token_ids), dtype=torch.long)
        mask = torch.as_tensor(list(s.loss_mask), dtype=torch.long)
        stacked.append(states)
        nxt, assistant = ids[1:], mask[1:].bool()  # position t predicts token t+1
        row_hits = row_assistant_hits = 0
        for start in range(0, len(nxt), TOKENS_PER_MATMUL):
            stop = min(start + TOKENS_PER_MATMUL, len(nxt))
            logits = head.logits(states[start:stop, -1])
            target = nxt[start:stop].to(logits.device)
            on = assistant[start:stop].to(logits.device)
            right = logits.argmax(-1) == target
            row_hits += int(right.sum())
            row_assistant_hits += int(right[on].sum())
            if on.any():
                logp = torch.log_softmax(logits[on], -1).gather(-1, target[on, None])
                nll_assistant -= float(logp.sum())
        n_assistant = int(assistant.sum())
        hits["all"] += row_hits
        counts["all"] += len(nxt)
        hits["assistant"] += row_assistant_hits
        counts["assistant"] += n_assistant
        per_row.append({"row": int(s.row), "tokens": len(ids), "assistant_tokens": n_assistant,
                        "top1_assistant": _share(row_assistant_hits, n_assistant)})
    return {
        "rows": [int(s.row) for s in samples],
        "tokens": sum(len(s.token_ids) for s in samples),
        "assistant_tokens": counts["assistant"],
        "top1_assistant": _share(hits["assistant"], counts["assistant"]),
        "top1_all": _share(hits["all"], counts["all"]),
        "nll_assistant": round(nll_assistant / counts["assistant"], 4) if counts["assistant"] else None,
        "last_layer": extracted[-1],
        "layers": layer_stats(stacked, extracted),
        "per_row": per_row,
    }


def _share(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def layer_stats(rows: Sequence, extracted: Sequence[int]) -> list[dict]:
    """Per stored layer of the rows' states (each [tokens, n_layers, hidden]): RMS, the spread over
    each row's tokens (mean per-feature std / RMS, token-weighted over the rows) and the relative
    difference ||a - b|| / max(||a||, ||b||) to the nearest other stored layer (and its id)."""
    import torch

    rows = [r.float() for r in rows if r.shape[0] > 0]
    if not rows:
        return []
    x = torch.cat(rows)
    norms = [float(x[:, j].norm()) for j in range(x.shape[1])]
    spread_rows = [r for r in rows if r.shape[0] > 1]  # one token has no spread
    weights = sum(r.shape[0] for r in spread_rows)
    out = []
    for j, layer in enumerate(extracted):
        xj = x[:, j]
        rms = float(xj.pow(2).mean().sqrt())
        spread = sum(float(r[:, j].std(dim=0, unbiased=False).mean()) * r.shape[0] for r in spread_rows)
        spread = spread / weights / rms if rms > 0 and weights else 0.0
        nearest, nearest_id = math.inf, None
        for k, other in enumerate(extracted):
            if k != j:
                scale = max(norms[j], norms[k])
                diff = float((xj - x[:, k]).norm()) / scale if scale > 0 else 0.0
                if diff < nearest:
                    nearest, nearest_id = diff, other
        out.append({"layer": int(layer), "rms": round(rms, 6), "token_spread": round(spread, 6),
                    "nearest_layer": nearest_id,
                    "nearest_difference": None if nearest_id is None else round(nearest, 6)})
    return out


# ---------------------------------------------------------------- a plain forward of a few rows

# Targets whose safetensors are at most this big are loaded in transformers (float32) for the
# recompute; bigger ones are not (the record says so): their check is the head's agreement alone.
RECOMPUTE_MAX_BYTES = 4 * 2**30
# A stored layer farther than this (relative difference) from the plain forward's is not that layer.
RECOMPUTE_TOLERANCE = 0.1


def recompute(target_dir: str | Path, samples: Sequence[Sample], extracted: Sequence[int],
              trust_remote_code: bool = False) -> dict:
    """The rows of `samples` through a plain transformers forward of the target (float32): per
    stored layer id, its largest relative difference ||stored - forward|| / ||forward|| over the
    rows, and the forward layer the stored one is nearest to (on the GPU when there is one; vLLM id i = transformers'
    hidden_states[i] for i < n; id n = the final norm's input). This needs no answers: it tells
    an off-by-one last layer from the right one whoever wrote the dataset. A target over
    RECOMPUTE_MAX_BYTES, or one transformers cannot load, is not recomputed: `skipped` says why."""
    weights = sum(p.stat().st_size for p in Path(target_dir).glob("*.safetensors"))
    if weights > RECOMPUTE_MAX_BYTES:
        return {"skipped": f"target weights {weights / 2**30:.1f} GiB > {RECOMPUTE_MAX_BYTES / 2**30:.0f} GiB: "
                           "not loaded in transformers; the head's agreement is the check"}
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32,
                                                     trust_remote_code=trust_remote_code).eval()
    except Exception as error:  # noqa: BLE001 - an architecture transformers lacks: recorded, said
        log.warning("fidelity recompute: transformers cannot load %s (%s): not recomputed", target_dir, error)
        return {"skipped": f"transformers cannot load the target: {type(error).__name__}: {error}"}
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the extraction engine has stopped by now
    model.to(device)
    worst = {int(i): (0.0, int(i), 0.0) for i in extracted}
    for s in samples:
        layers = _forward_layers(model, list(s.token_ids))
        stored = torch.as_tensor(s.hidden_states).to(device, torch.float32)
        for j, layer in enumerate(worst):
            diffs = [float((stored[:, j] - f).norm() / f.norm().clamp_min(1e-12)) for f in layers]
            nearest = min(range(len(diffs)), key=diffs.__getitem__)
            if diffs[layer] >= worst[layer][0]:
                worst[layer] = (diffs[layer], nearest, diffs[nearest])
    return {"rows": [int(s.row) for s in samples], "tolerance": RECOMPUTE_TOLERANCE,
            "layers": [{"layer": layer, "relative_difference": round(d, 6), "nearest_forward_layer": near,
                        "nearest_difference": round(near_d, 6)} for layer, (d, near, near_d) in worst.items()]}


def _forward_layers(model, ids: list[int]) -> list:
    """Every layer of one row as vLLM numbers them: [embeddings, layer 1, ..., layer n (pre-norm)]."""
    import torch

    captured = {}
    norm = model.get_decoder().norm
    hook = norm.register_forward_pre_hook(lambda module, args: captured.__setitem__("last", args[0][0]))
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids], device=model.device), output_hidden_states=True).hidden_states
    finally:
        hook.remove()
    return [h[0] for h in out[:-1]] + [captured["last"]]


def check_recompute(recomputed: dict | None, where: str) -> None:
    """Raise FidelityError when a stored layer is not the plain forward's layer of its id: farther
    from it than the tolerance, or clearly nearer another layer (under half the difference; adjacent
    middle layers of a real model can differ by ~1%, less than the tolerance)."""
    for layer in (recomputed or {}).get("layers", []):
        nearer = (layer["nearest_forward_layer"] != layer["layer"]
                  and layer["nearest_difference"] < 0.5 * layer["relative_difference"])
        if layer["relative_difference"] > recomputed["tolerance"] or nearer:
            raise FidelityError(
                f"{where} (dataset rows {_rows(recomputed['rows'])}): hidden-state fidelity: the stored layer id "
                f"{layer['layer']} differs from a plain transformers forward of the target by "
                f"{layer['relative_difference']:.3g} (relative, over {recomputed['tolerance']}); it is nearest to "
                f"the forward's layer {layer['nearest_forward_layer']}"
                + (" (an off-by-one in the layer ids)" if abs(layer["nearest_forward_layer"] - layer["layer"]) == 1
                   else "")
                + ": the stored states are not the target's layer they are named for; check the extraction "
                "(hidden_states.backend, its layer numbering, the vLLM or transformers version)"
            )


# ---------------------------------------------------------------- check


def check(measured: dict, min_top1: float, where: str, basis: str = "") -> None:
    """Raise FidelityError when a stored layer is all zero, one state for every token or a copy of
    another stored layer, or when the last layer's top-1 agreement on assistant positions is under
    `min_top1`. `where` names the shard folder (or the server); the message names the rows, the
    layer id, the figure and the bar, and what to do."""
    rows = measured.get("rows") or []
    at = f"{where} (dataset rows {_rows(rows)})"
    fix_states = (
        "the stored states are not the target's: check the extraction (hidden_states.backend, "
        "target.tensor_parallel_size / pipeline_parallel_size, the vLLM or transformers version); "
        "hidden_states.backend: transformers is a cross-check"
    )
    for layer in measured.get("layers", []):
        if layer["rms"] == 0:
            raise FidelityError(f"{at}: hidden-state fidelity: layer id {layer['layer']} is all zeros; {fix_states}")
        if layer["token_spread"] < MIN_TOKEN_SPREAD:
            raise FidelityError(
                f"{at}: hidden-state fidelity: layer id {layer['layer']} holds the same state for every token "
                f"(spread over tokens {layer['token_spread']:.2g} of its RMS, under {MIN_TOKEN_SPREAD}); {fix_states}"
            )
        if layer["nearest_layer"] is not None and layer["nearest_difference"] < MIN_LAYER_DIFFERENCE:
            raise FidelityError(
                f"{at}: hidden-state fidelity: layer id {layer['layer']} equals layer id {layer['nearest_layer']} "
                f"(relative difference {layer['nearest_difference']:.2g}, under {MIN_LAYER_DIFFERENCE}): one "
                f"layer's states were stored for several (as a tensor-parallel extraction bug does); {fix_states}"
            )
    top1 = measured.get("top1_assistant")
    if top1 is not None and top1 < min_top1:
        worst = sorted((r for r in measured.get("per_row", []) if r["top1_assistant"] is not None),
                       key=lambda r: r["top1_assistant"])[:3]
        rows_note = ", ".join(f"row {r['row']}: {r['top1_assistant']:.3f}" for r in worst)
        raise FidelityError(
            f"{at}: hidden-state fidelity: the target's final norm + lm_head on the stored last layer "
            f"(layer id {measured['last_layer']}) predicts the next token on {top1:.3f} of "
            f"{measured['assistant_tokens']} assistant positions (lowest: {rows_note}), under "
            f"hidden_states.fidelity.min_top1 = {min_top1}{f' ({basis})' if basis else ''}. Either {fix_states}; "
            "or the answers are not the target's top-1 tokens (the dataset's own answers, sampled ones, "
            "another chat template): then lower hidden_states.fidelity.min_top1 (docs/gpu.md, "
            "'Hidden-state fidelity')"
        )


def _rows(rows: Sequence[int]) -> str:
    rows = list(rows)
    return ", ".join(map(str, rows)) if len(rows) <= 10 else f"{', '.join(map(str, rows[:10]))}, ... ({len(rows)} rows)"


def record(measured: dict, settings: FidelitySettings) -> dict:
    """What a manifest or provenance keeps: the figures without the per-row list, and the bar."""
    out = {k: v for k, v in measured.items() if k != "per_row"}
    out["min_top1"] = settings.min_top1
    out["basis"] = settings.basis
    return out


def combine(records: dict[str, dict | None]) -> dict | None:
    """One figure over the shards' records {shard: record or None} (token-weighted agreement), for
    the view. Every shard counts: one without a record (hidden_states.fidelity.rows 0 when it was
    made, or a shard from before the check) is `unchecked` and named; each checked shard keeps its
    own bar (`bars`); `min_top1` and `basis` are the shards' common ones (the highest bar and
    "differs by shard" when they differ). None when no shard was checked."""
    checked = {shard: r for shard, r in records.items() if r}
    if not checked:
        return None
    assistant = sum(r["assistant_tokens"] for r in checked.values())
    hits = sum((r["top1_assistant"] or 0) * r["assistant_tokens"] for r in checked.values())
    bars = {shard: r["min_top1"] for shard, r in checked.items()}
    bases = {r["basis"] for r in checked.values()}
    return {
        "rows": sum(len(r["rows"]) for r in checked.values()),
        "assistant_tokens": assistant,
        "top1_assistant": round(hits / assistant, 4) if assistant else None,
        "lowest_shard_top1_assistant": min((r["top1_assistant"] for r in checked.values()
                                            if r["top1_assistant"] is not None), default=None),
        "shards": len(records),
        "checked_shards": len(checked),
        "unchecked_shards": sorted(shard for shard in records if shard not in checked),
        "bars": bars,
        "min_top1": max(bars.values()),
        "basis": bases.pop() if len(bases) == 1 else "differs by shard (see bars)",
    }
