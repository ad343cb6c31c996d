"""Draft algorithms: what kind of draft is trained, keyed like speculators' own
`--speculator-type` (config `draft.algorithm`, default `eagle3`).

An algorithm says everything that differs between draft kinds, and nothing else:
- `draft_keys`: the `draft:` settings its config is built from (only they rerun its config);
- `build_config(...)`: the speculators config (config.json only) a fresh draft starts from;
- `config_facts(config_json)`: what the other stages check against (aux layers, sizes);
- `trainer_args(...)`: the Trainer flags beyond the common ones (`draftline.stages.train`);
- `expected_tensors(facts)`: the tensors a checkpoint must hold, with their shapes;
- `model_class()`: the speculators model class (the untrained baseline is built from it the way
  the Trainer builds a fresh draft);
- `speculative_config(checkpoint, k)`: how vLLM serves it;
- `serving_problem(config_json, served, vllm_version)`: how the installed vLLM would serve it
  unlike it was trained, or not load it, from the model config vLLM's own speculators reader makes
  of it (None: as trained);
- `planned_vllm_problems(settings, aux_layers, vllm_version)`: the same, said at plan time from the
  settings and the vLLM the plan pins (the GPU lock), before any GPU time is spent.

To add one: write `draftline/algorithms/<name>.py` with a module-level `ALGORITHM` object, add
one line to `ALGORITHMS` below and the name to `draft.algorithm`'s enum in the config schema.
`draftline/algorithms/dflash.py` is the worked example beside `eagle3.py` (docs/DESIGN.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from draftline.settings import DEFAULTS, DraftBlock

# name (config draft.algorithm = speculators' speculator_type) -> module holding ALGORITHM
ALGORITHMS = {
    "eagle3": "draftline.algorithms.eagle3",
    "dflash": "draftline.algorithms.dflash",
    "dflash2": "draftline.algorithms.dflash2",
    "dspark": "draftline.algorithms.dspark",
    "peagle": "draftline.algorithms.peagle",
}


@dataclass(frozen=True)
class ConfigFacts:
    """What the stages check a draft's config.json against."""

    aux_layer_ids: list[int]  # target layers the draft reads (without the last one)
    hidden_size: int  # the draft's (= the target's) hidden size
    draft_vocab_size: int
    target_vocab_size: int
    # the config's proposal length (speculators_config's default proposal method): P-EAGLE's depths
    speculative_tokens: int | None = None


def proposal_length(config: dict) -> int | None:
    """The speculative tokens of a config.json's default proposal method (None: it names none)."""
    block = config.get("speculators_config") or {}
    for method in block.get("proposal_methods") or []:
        if method.get("proposal_type") == block.get("default_proposal_method"):
            return int(method["speculative_tokens"])
    return None


@dataclass(frozen=True)
class DraftSettings:
    """The `draft:` config block plus the training settings the config depends on."""

    num_layers: int = DEFAULTS.draft.num_layers
    ttt_steps: int = DEFAULTS.train.ttt_steps  # positions trained per step, vLLM's default k
    block_size: int = DEFAULTS.draft.block_size  # dflash: tokens proposed per forward pass
    num_depths: int = DEFAULTS.draft.num_depths  # peagle: parallel depths trained
    sample_from_anchor: bool | None = DEFAULTS.draft.sample_from_anchor  # dspark: the anchor proposes too

    @classmethod
    def from_config(cls, block: dict | DraftBlock, **more) -> DraftSettings:
        """The `draft:` block (or the part of it a rule's param holds) read as its model, DraftBlock
        (a key left out is its default), with `more` (train.ttt_steps) beside it."""
        if not isinstance(block, DraftBlock):
            block = DraftBlock.model_validate({k: v for k, v in block.items() if k in DraftBlock.model_fields})
        return cls(**{k: getattr(block, k) for k in cls.__dataclass_fields__ if k in DraftBlock.model_fields and k not in more},
                   **more)


class DraftAlgorithm(Protocol):
    name: str  # speculators' speculator_type
    vllm_method: str  # vLLM's speculative_config["method"]
    draft_keys: tuple[str, ...]  # the `draft:` settings its config is built from

    def build_config(self, target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings,
                     trust_remote_code: bool = False): ...

    def config_facts(self, config: dict) -> ConfigFacts: ...

    def trainer_args(self, settings: DraftSettings, facts: ConfigFacts) -> list[str]: ...

    def expected_tensors(self, facts: ConfigFacts) -> dict[str, list[int]]: ...

    def model_class(self): ...

    def speculative_config(self, checkpoint: str | Path, num_speculative_tokens: int) -> dict: ...

    def serving_problem(self, config: dict, served: dict, vllm_version: str) -> str | None: ...

    def planned_vllm_problems(self, settings: DraftSettings, aux_layers: int, vllm_version: str) -> list[str]: ...


class FusedAuxDraft:
    """What EAGLE-3 and DFlash share: `fc` fuses the aux layers' hidden states into one, the
    draft's own `lm_head` over the draft vocabulary with the d2t/t2d maps, and vLLM serving it
    by `vllm_method`. An algorithm subclasses it and says the rest."""

    name: str
    vllm_method: str
    aux_key: str  # the config.json key listing the aux layer ids
    draft_keys: tuple[str, ...] = ("num_layers",)  # the `draft:` settings its config is built from
    # why vLLM cannot serve this draft without a GPU (None: it can), said before an engine loads
    not_served_on_cpu: str | None = None

    def config_facts(self, config: dict) -> ConfigFacts:
        tl = config["transformer_layer_config"]
        return ConfigFacts(
            aux_layer_ids=[int(i) for i in config[self.aux_key]],
            hidden_size=int(tl["hidden_size"]),
            draft_vocab_size=int(config["draft_vocab_size"]),
            target_vocab_size=int(tl["vocab_size"]),
            speculative_tokens=proposal_length(config),
        )

    def expected_tensors(self, facts: ConfigFacts) -> dict[str, list[int]]:
        h = facts.hidden_size
        return {
            "fc.weight": [h, len(facts.aux_layer_ids) * h],
            "lm_head.weight": [facts.draft_vocab_size, h],
            "d2t": [facts.draft_vocab_size],
            "t2d": [facts.target_vocab_size],
        }

    def speculative_config(self, checkpoint: str | Path, num_speculative_tokens: int) -> dict:
        return {"method": self.vllm_method, "model": str(checkpoint), "num_speculative_tokens": num_speculative_tokens}

    def serving_problem(self, config: dict, served: dict, vllm_version: str) -> str | None:
        """How the draft of `config` would be served unlike it was trained (or not loaded), by vLLM
        `vllm_version` whose speculators reader turns `config` into `served` (the model config it
        loads); None: as trained."""
        return None

    def planned_vllm_problems(self, settings: DraftSettings, aux_layers: int, vllm_version: str) -> list[str]:
        """What `serving_problem` will say of a draft trained with `settings` on `aux_layers` aux
        layers, served by vLLM `vllm_version` (the plan's pin): [] where nothing."""
        return []


def get(name: str) -> DraftAlgorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"draft.algorithm {name!r}: expected one of {', '.join(sorted(ALGORITHMS))}")
    return importlib.import_module(ALGORITHMS[name]).ALGORITHM


def draft_settings(block: dict) -> dict:
    """The validated `draft:` block without the settings its algorithm does not read (a
    speculator_config param: changing P-EAGLE's depths does not rerun an EAGLE-3 run)."""
    algorithm = get(block["algorithm"])
    return {"algorithm": block["algorithm"], **{key: block[key] for key in algorithm.draft_keys}}


def of_config(config: dict, where: str) -> DraftAlgorithm:
    """The algorithm a draft's config.json was written for (speculators' `speculators_model_type`)."""
    name = config.get("speculators_model_type")
    if name not in ALGORITHMS:
        raise ValueError(
            f"{where}: speculators_model_type {name!r} is no draft algorithm draftline knows "
            f"({', '.join(sorted(ALGORITHMS))})"
        )
    return get(name)


def check_checkpoint(folder: str | Path, algorithm: DraftAlgorithm, facts: ConfigFacts) -> dict:
    """The tensors vLLM's loader needs, with the shapes this config implies; their shapes."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / "model.safetensors"), framework="pt") as handle:
        shapes = {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
    expected = algorithm.expected_tensors(facts)
    wrong = {k: shapes.get(k) for k, v in expected.items() if v is not None and shapes.get(k) != v}
    missing_layers = not any(k.startswith("layers.0.") for k in shapes)
    if wrong or missing_layers:
        raise RuntimeError(
            f"{folder}/model.safetensors: unexpected tensors {wrong} for a {algorithm.name} draft "
            f"(expected {expected}, and layers.0.*)"
        )
    return shapes
