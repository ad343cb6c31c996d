"""A plain forward of a few rows: the target in transformers (float32), every layer compared with
the stored one of its id (recompute), for targets small enough to load."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from draftline.fidelity.measure import Sample

log = logging.getLogger(__name__)

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
