"""`results/target/layer_ids.json`: which target layers feed the draft, resolved once.

`aux` are speculators' `target_layer_ids` (the draft's auxiliary inputs); extraction also
captures the last layer (id = num_hidden_layers), which the trainer uses as the verifier's
final hidden state. Ids follow vLLM's convention: id i is the output of decoder layer i.
Written by the layer_ids rule; read by the disk estimate, extraction, the speculator config
and training, all through `read`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftline.runtime.atomic import atomic_file


@dataclass(frozen=True)
class LayerIds:
    aux: list[int]
    num_hidden_layers: int

    @property
    def extracted(self) -> list[int]:
        """What vLLM captures: the aux layers, then the last layer."""
        return [*self.aux, self.num_hidden_layers]

    def to_json(self) -> dict:
        return {"aux": self.aux, "extracted": self.extracted, "num_hidden_layers": self.num_hidden_layers}

    def check_target(self, num_hidden_layers: int, source: str) -> None:
        """Stop when these ids were resolved for a target of another depth."""
        if self.num_hidden_layers != num_hidden_layers:
            raise ValueError(
                f"{source}: layer ids {self.extracted} were resolved for a target with "
                f"{self.num_hidden_layers} layers, but the target has {num_hidden_layers}; rerun "
                "the layer_ids rule"
            )


def write(path: str | Path, ids: LayerIds) -> None:
    with atomic_file(path) as out:
        json.dump(ids.to_json(), out, indent=1)
        out.write("\n")


def read(path: str | Path) -> LayerIds:
    """The file's ids, checked for shape; errors name the file and the key."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read layer ids ({err}); rerun the layer_ids rule") from err
    try:
        aux = [int(i) for i in raw["aux"]]
        n = int(raw["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path}: expected {{'aux': [int, ...], 'num_hidden_layers': int}}, key {err} is missing "
            "or wrong; rerun the layer_ids rule"
        ) from None
    ids = LayerIds(aux=aux, num_hidden_layers=n)
    if "extracted" in raw and [int(i) for i in raw["extracted"]] != ids.extracted:
        raise ValueError(f"{path}: 'extracted' {raw['extracted']} is not aux + [num_hidden_layers] = {ids.extracted}")
    return ids
