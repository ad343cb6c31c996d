"""The layer_ids step: which target layers feed the draft, resolved once for extraction, the
speculator config and training (`draftline.artifacts.layer_ids` is the file)."""

from __future__ import annotations

from draftline.artifacts.layer_ids import LayerIds
from draftline.artifacts.target import dims
from draftline.settings.target_shape import check_aux_layer_ids


def resolve_layer_ids(setting: str | list[int], target_dir: str, trust_remote_code: bool = False) -> LayerIds:
    """`auto` means speculators' default for the target's depth: [2, n//2, n-3]."""
    from speculators.models.utils import resolve_target_layer_ids

    n = dims(target_dir, trust_remote_code).num_hidden_layers
    requested = None if setting == "auto" else [int(i) for i in setting]
    if requested is not None:
        check_aux_layer_ids(requested, n, str(target_dir))
    aux = resolve_target_layer_ids(requested, target_dir, trust_remote_code=trust_remote_code)
    return LayerIds(aux=list(aux), num_hidden_layers=n)
