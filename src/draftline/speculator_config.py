"""The draft's architecture as a speculators `Eagle3SpeculatorConfig` (config.json only).

Built the way `speculators train` builds a fresh eagle3 draft: its own flag defaults
(`TrainConfig`), `create_transformer_layer_config` from the verifier, and the same
config fields `Eagle3DraftModel.from_training_args` sets, without instantiating weights.
A folder holding only this config.json is what `speculators train --from-pretrained DIR`
takes for a fresh init.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftline.atomic import atomic_dir

log = logging.getLogger(__name__)


def resolve_train_args(
    target: str,
    aux_layer_ids: list[int],
    draft_vocab_size: int,
    num_layers: int,
    ttt_steps: int,
    trust_remote_code: bool,
) -> dict:
    """speculators' resolved training arguments for a fresh eagle3 draft (its defaults)."""
    from speculators.train.config import TrainConfig

    argv = [
        "--verifier-name-or-path", target,
        "--speculator-type", "eagle3",
        "--num-layers", str(num_layers),
        "--draft-vocab-size", str(draft_vocab_size),
        "--target-layer-ids", *[str(i) for i in aux_layer_ids],
        "--ttt-steps", str(ttt_steps),
    ]  # fmt: skip
    if trust_remote_code:
        argv.append("--trust-remote-code")
    return TrainConfig.resolve(argv).flatten()


def build_speculator_config(
    target: str | Path,
    aux_layer_ids: list[int],
    draft_vocab_size: int,
    num_layers: int = 1,
    ttt_steps: int = 3,
    trust_remote_code: bool = False,
):
    """An `Eagle3SpeculatorConfig` for `target` (a local folder or hub id, recorded as given)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.utils import resolve_target_layer_ids
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.cli import create_transformer_layer_config

    from draftline.vocab import target_vocab_size

    target = str(target)
    vocab = target_vocab_size(target, trust_remote_code)
    if draft_vocab_size > vocab:
        raise ValueError(
            f"vocab.draft_vocab_size = {draft_vocab_size} is larger than the target's vocabulary "
            f"({vocab} tokens): lower it in config/config.yaml"
        )
    args = resolve_train_args(
        target, aux_layer_ids, draft_vocab_size, num_layers, ttt_steps, trust_remote_code
    )
    layer_config = create_transformer_layer_config(
        verifier_name_or_path=target,
        num_layers=args["num_layers"],
        draft_arch=args["draft_arch"],
        hidden_act=args["draft_hidden_act"],
        sliding_window=args["sliding_window"],
        full_attention_indices=args["full_attention_indices"],
        mrope_full_head_hack=args["draft_mrope_full_head_hack"],
        trust_remote_code=trust_remote_code,
    )
    # Same fields, same order of precedence as Eagle3DraftModel.from_training_args.
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=draft_vocab_size,
        norm_before_residual=args["norm_before_residual"],
        norm_before_fc=args["norm_before_fc"],
        fc_norm=args["fc_norm"],
        norm_output=args["norm_output"],
        embed_requires_grad=args["embed_requires_grad"],
        eagle_aux_hidden_state_layer_ids=resolve_target_layer_ids(
            list(aux_layer_ids), target, trust_remote_code=trust_remote_code
        ),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            # The proposal length vLLM reads as a default: the depth the draft is trained for.
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=args["ttt_steps"])],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(target),
        ),
    )


def _essentials(config) -> dict:
    """The fields training and vLLM depend on (transformers versions differ in the rest)."""
    tl = config.transformer_layer_config
    return {
        "type": config.speculators_model_type,
        "draft_vocab_size": config.draft_vocab_size,
        "aux": config.eagle_aux_hidden_state_layer_ids,
        "layer": (tl.model_type, tl.num_hidden_layers, tl.hidden_size, tl.vocab_size, tl.head_dim),
        "verifier": config.speculators_config.verifier.name_or_path,
        "speculative_tokens": config.speculators_config.proposal_methods[0].speculative_tokens,
    }


def write_speculator_config(
    out_dir: str | Path,
    target: str | Path,
    layer_ids_path: str | Path,
    draft_vocab_size: int,
    num_layers: int = 1,
    ttt_steps: int = 3,
    trust_remote_code: bool = False,
) -> Path:
    """Publish `out_dir/config.json` (and nothing else: a config-only folder)."""
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    # A local target is recorded by absolute path: speculators reloads the verifier (its
    # embeddings, layer count) from config.json at training and load time, from any cwd.
    target = str(Path(target).resolve()) if Path(target).exists() else str(target)
    layer_ids = json.loads(Path(layer_ids_path).read_text())
    try:
        aux = [int(i) for i in layer_ids["aux"]]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{layer_ids_path}: expected {{'aux': [int, ...], ...}} ({err})") from err
    config = build_speculator_config(
        target, aux, draft_vocab_size, num_layers, ttt_steps, trust_remote_code
    )
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
        loaded = Eagle3SpeculatorConfig.from_pretrained(staging)
        if _essentials(loaded) != _essentials(config):
            raise RuntimeError(
                f"speculator config does not round-trip through from_pretrained: wrote "
                f"{_essentials(config)}, read back {_essentials(loaded)}"
            )
    tl = config.transformer_layer_config
    log.info(
        "eagle3 config: %d draft layer(s), hidden %d, draft vocab %d of %d, aux layers %s, verifier %s",
        tl.num_hidden_layers,
        tl.hidden_size,
        config.draft_vocab_size,
        tl.vocab_size,
        config.eagle_aux_hidden_state_layer_ids,
        config.speculators_config.verifier.name_or_path,
    )
    return Path(out_dir)
