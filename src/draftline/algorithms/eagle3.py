"""EAGLE-3 (speculators' `eagle3`): one decoder layer (or more) over the concatenated aux
hidden states, trained with test-time-training steps; vLLM serves it with method `eagle3`.

The config is built the way `speculators train` builds a fresh eagle3 draft: its own flag
defaults (`TrainConfig`), `create_transformer_layer_config` from the verifier, and the same
config fields `Eagle3DraftModel.from_training_args` sets, without instantiating weights.
"""

from __future__ import annotations

from draftline.algorithms import ConfigFacts, DraftSettings, FusedAuxDraft


def resolve_train_args(
    target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings, name: str,
    trust_remote_code: bool, extra: list[str] = (),
) -> dict:
    """speculators' resolved training arguments for a fresh draft of type `name` (its defaults,
    `extra` flags on top)."""
    from speculators.train.config import TrainConfig

    argv = [
        "--verifier-name-or-path", target,
        "--speculator-type", name,
        "--num-layers", str(settings.num_layers),
        "--draft-vocab-size", str(draft_vocab_size),
        "--target-layer-ids", *[str(i) for i in aux],
        "--ttt-steps", str(settings.ttt_steps),
        *extra,
    ]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    return TrainConfig.resolve(argv).flatten()


def transformer_layer_config(target: str, args: dict, trust_remote_code: bool):
    """The draft decoder's config from the verifier, as the Trainer makes it."""
    from speculators.train.cli import create_transformer_layer_config

    return create_transformer_layer_config(
        verifier_name_or_path=target,
        num_layers=args["num_layers"],
        draft_arch=args["draft_arch"],
        hidden_act=args["draft_hidden_act"],
        sliding_window=args["sliding_window"],
        full_attention_indices=args["full_attention_indices"],
        mrope_full_head_hack=args["draft_mrope_full_head_hack"],
        trust_remote_code=trust_remote_code,
    )


def config_from_training_args(model_class, layer, args: dict):
    """The config `model_class.from_training_args` builds from speculators' resolved arguments and
    the draft decoder's config, without building the model: the classmethod runs on a stand-in
    class that keeps the config, so every field and default is speculators' own, not a copy."""

    class KeepConfig:
        _build_base_config_kwargs = getattr(model_class, "_build_base_config_kwargs", None)

        def __init__(self, config):
            self.config = config

        def load_vocab_mappings(self, t2d, d2t):
            pass

        def load_verifier_weights(self):
            pass

    return model_class.from_training_args.__func__(KeepConfig, verifier_config=layer, **args).config


def training_config(algorithm, target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings,
                    trust_remote_code: bool, extra: list[str] = ()):
    """A fresh draft's config as `speculators train --speculator-type <algorithm.name>` builds it:
    the Trainer's resolved flags (`extra` on top), the decoder config from the verifier, the mask
    token resolved as the Trainer resolves it, then the model class's own `from_training_args`."""
    from speculators.train.utils import resolve_mask_token_id

    args = resolve_train_args(target, aux, draft_vocab_size, settings, algorithm.name, trust_remote_code, extra=extra)
    layer = transformer_layer_config(target, args, trust_remote_code)
    args["mask_token_id"] = resolve_mask_token_id(target, layer.vocab_size, args.get("mask_token_id"),
                                                  trust_remote_code=trust_remote_code)
    return config_from_training_args(algorithm.model_class(), layer, args)


def speculators_config(target: str, name: str, speculative_tokens: int):
    """The `speculators_config` block: algorithm, vLLM's default proposal length, verifier."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    return SpeculatorsConfig(
        algorithm=name,
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=speculative_tokens)],
        default_proposal_method="greedy",
        verifier=VerifierConfig.from_pretrained(target),
    )


class Eagle3(FusedAuxDraft):
    name = "eagle3"
    aux_key = "eagle_aux_hidden_state_layer_ids"
    vllm_method = "eagle3"

    def build_config(self, target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings,
                     trust_remote_code: bool = False):
        from speculators.models.eagle3 import Eagle3SpeculatorConfig
        from speculators.models.utils import resolve_target_layer_ids

        args = resolve_train_args(target, aux, draft_vocab_size, settings, self.name, trust_remote_code)
        # Same fields, same order of precedence as Eagle3DraftModel.from_training_args.
        return Eagle3SpeculatorConfig(
            transformer_layer_config=transformer_layer_config(target, args, trust_remote_code),
            draft_vocab_size=draft_vocab_size,
            norm_before_residual=args["norm_before_residual"],
            norm_before_fc=args["norm_before_fc"],
            fc_norm=args["fc_norm"],
            norm_output=args["norm_output"],
            embed_requires_grad=args["embed_requires_grad"],
            eagle_aux_hidden_state_layer_ids=resolve_target_layer_ids(
                list(aux), target, trust_remote_code=trust_remote_code
            ),
            # The proposal length vLLM reads as a default: the depth the draft is trained for.
            speculators_config=speculators_config(target, self.name, args["ttt_steps"]),
        )

    def trainer_args(self, settings: DraftSettings, facts: ConfigFacts) -> list[str]:
        return ["--speculator-type", self.name, "--ttt-steps", str(settings.ttt_steps)]

    def model_class(self):
        from speculators.models.eagle3 import Eagle3DraftModel

        return Eagle3DraftModel


ALGORITHM = Eagle3()
