"""Which target layers feed the draft: one resolution shared by extraction, config and training.

`aux` are speculators' `target_layer_ids` (the draft's auxiliary inputs); extraction also
captures the last layer (id = num_hidden_layers), which the trainer uses as the verifier's
final hidden state. Ids follow vLLM's convention: id i is the output of decoder layer i.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerIds:
    aux: list[int]
    num_hidden_layers: int

    @property
    def extracted(self) -> list[int]:
        """What vLLM captures: the aux layers, then the last layer."""
        return [*self.aux, self.num_hidden_layers]


def resolve_layer_ids(setting: str | list[int], target_dir: str, trust_remote_code: bool = False) -> LayerIds:
    """`auto` means speculators' default for the target's depth: [2, n//2, n-3]."""
    from speculators.models.utils import get_verifier_config, resolve_target_layer_ids

    n = get_verifier_config(target_dir, trust_remote_code=trust_remote_code).num_hidden_layers
    requested = None if setting == "auto" else [int(i) for i in setting]
    if requested is not None:
        bad = [i for i in requested if not 1 <= i < n]
        if bad or len(set(requested)) != len(requested):
            raise ValueError(
                f"hidden_states.layer_ids {requested}: the target has {n} layers, so aux layer "
                f"ids must be distinct and within 1..{n - 1} (the last layer, {n}, is added "
                "automatically)"
            )
    aux = resolve_target_layer_ids(requested, target_dir, trust_remote_code=trust_remote_code)
    return LayerIds(aux=list(aux), num_hidden_layers=n)
