"""The speculator_config step: the draft's architecture as a speculators config (config.json
only), for the configured draft algorithm (`draftline.algorithms`).

A folder holding only this config.json is what `speculators train --from-pretrained DIR` takes
for a fresh init; it is read back through speculators before it is published.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftline import algorithms
from draftline.algorithms import DraftSettings
from draftline.artifacts import layer_ids
from draftline.artifacts.target import vocab_size as target_vocab_size
from draftline.runtime.atomic import atomic_dir
from draftline.settings.target_shape import check_draft_vocab

log = logging.getLogger(__name__)


def build_speculator_config(
    target: str | Path,
    aux_layer_ids: list[int],
    draft_vocab_size: int,
    settings: DraftSettings = DraftSettings(),
    algorithm: str = "eagle3",
    trust_remote_code: bool = False,
):
    """The algorithm's speculators config for `target` (a local folder or hub id, recorded as given)."""
    target = str(target)
    check_draft_vocab(draft_vocab_size, target_vocab_size(target, trust_remote_code), target)
    return algorithms.get(algorithm).build_config(target, list(aux_layer_ids), draft_vocab_size, settings,
                                                  trust_remote_code)


def _essentials(config: dict) -> dict:
    """The fields training and vLLM depend on (transformers versions differ in the rest)."""
    algorithm = algorithms.of_config(config, "config.json")
    tl = config["transformer_layer_config"]
    sc = config["speculators_config"]
    return {
        "type": config["speculators_model_type"],
        "facts": algorithm.config_facts(config),
        "layer": (tl.get("model_type"), tl.get("num_hidden_layers"), tl.get("head_dim")),
        "verifier": sc["verifier"]["name_or_path"],
        "speculative_tokens": sc["proposal_methods"][0]["speculative_tokens"],
    }


def write_speculator_config(
    out_dir: str | Path,
    target: str | Path,
    layer_ids_path: str | Path,
    draft_vocab_size: int,
    settings: DraftSettings = DraftSettings(),
    algorithm: str = "eagle3",
    trust_remote_code: bool = False,
) -> Path:
    """Publish `out_dir/config.json` (and nothing else: a config-only folder)."""
    # A local target is recorded by absolute path: speculators reloads the verifier (its
    # embeddings, layer count) from config.json at training and load time, from any cwd.
    target = str(Path(target).resolve()) if Path(target).exists() else str(target)
    aux = layer_ids.read(layer_ids_path).aux
    config = build_speculator_config(target, aux, draft_vocab_size, settings, algorithm, trust_remote_code)
    with atomic_dir(out_dir) as staging:
        config.save_pretrained(staging)
        # transformers copies speculators' own config.py beside it (custom-class export);
        # speculators and vLLM load the config without it, and the folder must hold only
        # config.json.
        (staging / "config.py").unlink(missing_ok=True)
        extra = sorted(p.name for p in staging.iterdir() if p.name != "config.json")
        if extra:
            raise RuntimeError(f"save_pretrained wrote more than config.json: {extra}")
        # Checked before publishing: speculators must read back what it will train from.
        written = json.loads((staging / "config.json").read_text())
        loaded = type(config).from_pretrained(staging).to_dict()
        if _essentials(loaded) != _essentials(written):
            raise RuntimeError(
                f"speculator config does not round-trip through from_pretrained: wrote "
                f"{_essentials(written)}, read back {_essentials(loaded)}"
            )
    facts = algorithms.get(algorithm).config_facts(written)
    log.info(
        "%s config: %d draft layer(s), hidden %d, draft vocab %d of %d, aux layers %s, verifier %s",
        algorithm, settings.num_layers, facts.hidden_size, facts.draft_vocab_size, facts.target_vocab_size,
        facts.aux_layer_ids, target,
    )
    return Path(out_dir)
