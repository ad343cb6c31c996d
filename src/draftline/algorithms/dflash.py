"""DFlash (speculators' `dflash`): a block-diffusion draft. From the target's aux hidden states
it predicts a whole block of tokens in one forward pass (the anchor token plus `block_size - 1`
masked positions), instead of one token per pass as EAGLE-3 does; vLLM serves it with method
`dflash`. It reads the same hidden-state files as EAGLE-3 (aux layers + the last layer).

The config is speculators' own, as `speculators train` builds a fresh draft
(`eagle3.training_config`): `create_transformer_layer_config` from the verifier, the mask token
resolved as the Trainer resolves it, then `DFlashDraftModel.from_training_args`.
"""

from __future__ import annotations

from draftline.algorithms import ConfigFacts, DraftSettings, FusedAuxDraft
from draftline.algorithms.eagle3 import training_config


class DFlash(FusedAuxDraft):
    name = "dflash"
    aux_key = "aux_hidden_state_layer_ids"
    vllm_method = "dflash"
    draft_keys = ("num_layers", "block_size")

    def build_config(self, target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings,
                     trust_remote_code: bool = False):
        return training_config(self, target, aux, draft_vocab_size, settings, trust_remote_code,
                               extra=["--block-size", str(settings.block_size)])

    def trainer_args(self, settings: DraftSettings, facts: ConfigFacts) -> list[str]:
        # The block size and mask token come from the config (--from-pretrained).
        return ["--speculator-type", self.name]

    def model_class(self):
        from speculators.models.dflash import DFlashDraftModel

        return DFlashDraftModel


ALGORITHM = DFlash()
