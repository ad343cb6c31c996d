"""P-EAGLE (speculators' `peagle`): an EAGLE-3 draft trained to propose all its tokens in one
forward pass (parallel drafting: the positions after the first are fed a learned mask hidden
state and the mask token), with Conditional-On-Distribution sampling of the trained depths.
vLLM serves it as `eagle3` with `parallel_drafting` (what vLLM's speculators config reader sets
for a `peagle` checkpoint). It reads the same hidden states as EAGLE-3.

The config is the one `PEagleDraftModel.from_training_args` builds from the Trainer's resolved
flags (`--num-depths` from draft.num_depths, speculators' default 8; trainable embeddings).
"""

from __future__ import annotations

from pathlib import Path

from draftline.algorithms import ConfigFacts, DraftSettings, FusedAuxDraft
from draftline.algorithms.eagle3 import training_config


class PEagle(FusedAuxDraft):
    name = "peagle"
    aux_key = "eagle_aux_hidden_state_layer_ids"
    vllm_method = "eagle3"
    draft_keys = ("num_layers", "num_depths")

    def build_config(self, target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings,
                     trust_remote_code: bool = False):
        return training_config(self, target, aux, draft_vocab_size, settings, trust_remote_code,
                               extra=["--num-depths", str(settings.num_depths)])

    def trainer_args(self, settings: DraftSettings, facts: ConfigFacts) -> list[str]:
        # the depths the config was built with (its proposal length); speculators' COD ratios; the
        # mask token comes with the config
        return ["--speculator-type", self.name, "--num-depths", str(facts.speculative_tokens)]

    def expected_tensors(self, facts: ConfigFacts) -> dict[str, list[int]]:
        # the hidden state fed to the parallel positions, over the fused aux layers
        return {**super().expected_tensors(facts), "mask_hidden": [1, 1, len(facts.aux_layer_ids) * facts.hidden_size]}

    def model_class(self):
        from speculators.models.peagle import PEagleDraftModel

        return PEagleDraftModel

    def speculative_config(self, checkpoint: str | Path, num_speculative_tokens: int) -> dict:
        return {**super().speculative_config(checkpoint, num_speculative_tokens), "parallel_drafting": True}


ALGORITHM = PEagle()
