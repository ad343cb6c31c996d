"""What every CUDA measurement runs on: the target sizes, the random target and its tokenizer, the
random dataset. The record (header, results file, device and host facts, GPU memory) is the
benchmarks' one harness's, benchmarks/record_run.py, which this puts on the path.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness

log = logging.getLogger("bench")

# The entry point the measurements that run in fresh processes start again (`extract-calls`,
# `extract-shard`).
ENTRY = str(Path(__file__).resolve().with_name("bench_cuda.py"))

SIZES = {
    # Llama-3.1-8B's shape (rope scaling left out: it does not change the cost).
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
               rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=2048, max_position_embeddings=4096,
                 rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
}


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------- the target and data measured


def build_target(folder: Path, size: str) -> dict:
    """A Llama target with random bf16 weights, saved as a Hugging Face folder with `save_tokenizer`'s tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    config = LlamaConfig(**SIZES[size], bos_token_id=1, eos_token_id=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    params = sum(p.numel() for p in model.parameters())
    embed = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    # The weights extraction multiplies by: the decoder layers' linear layers (no embedding
    # lookup, no lm_head; norms are elementwise).
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    build_s = time.perf_counter() - t0
    model.save_pretrained(folder)
    save_tokenizer(folder, config.vocab_size)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"params": params, "params_without_embeddings_and_head": params - embed,
            "decoder_linear_params": linear, "dtype": str(dtype),
            "config": SIZES[size], "build_s": round(build_s, 1), "save_s": round(time.perf_counter() - t0 - build_s, 1),
            "bytes": sum(f.stat().st_size for f in folder.glob("*.safetensors"))}


def save_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level tokenizer of exactly `vocab_size` ids with the ChatML template, so that vLLM
    loads the random target as it loads a real one and can turn any generated id into text.

    Ids 0-2 are the special tokens (<|endoftext|>, <|im_start|> = bos 1, <|im_end|> = eos 2, as in
    `build_target`'s config), then the 256 byte pieces (text is encoded one byte per token), then
    fillers (" w<i>") that only decoding meets: a random model generates any id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from draftline.testing.tiny_model import CHATML_TEMPLATE, SPECIAL_TOKENS

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for piece in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[piece] = len(vocab)
    filler = 0
    while len(vocab) < vocab_size:
        vocab[f"\u0120w{filler}"] = len(vocab)  # \u0120: the byte-level space
        filler += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                            unk_token="<|endoftext|>", pad_token="<|endoftext|>",
                            chat_template=CHATML_TEMPLATE).save_pretrained(folder)


def build_data(work: Path, target: Path, rows: int, seq_len: int, draft_vocab: int, vocab: int) -> dict:
    """Tokenized dataset (speculators' columns), layer ids, vocab maps, speculator config."""
    import numpy as np
    from datasets import Dataset

    from draftline.artifacts import layer_ids as layer_ids_file
    from draftline.stages.layer_ids import resolve_layer_ids
    from draftline.stages.speculator_config import write_speculator_config
    from draftline.stages.vocab import build_vocab_maps

    rng = random.Random(0)
    lengths = [rng.randint(seq_len * 3 // 4, seq_len * 5 // 4) for _ in range(rows)]
    # Zipf-like token ids, so the draft vocab covers most tokens as with real text.
    weights = [1 / (i + 10) for i in range(vocab)]
    ids = [rng.choices(range(vocab), weights=weights, k=n) for n in lengths]
    # Loss on the second half of each row: the "assistant" part.
    masks = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": masks, "seq_len": lengths})
    ds.set_format(type="torch")
    ds.save_to_disk(str(work / "dataset"))
    freq: dict[int, int] = {}
    for row in ids:
        for t in row:
            freq[t] = freq.get(t, 0) + 1
    d2t, t2d = build_vocab_maps(freq, draft_vocab, vocab)
    np.save(work / "d2t.npy", d2t)
    np.save(work / "t2d.npy", t2d)
    ids_ = resolve_layer_ids("auto", str(target))
    layer_ids_file.write(work / "layer_ids.json", ids_)
    write_speculator_config(work / "config", target, work / "layer_ids.json", draft_vocab)
    return {"rows": rows, "tokens": sum(lengths), "min_len": min(lengths), "max_len": max(lengths),
            "layer_ids": ids_.extracted, "draft_vocab": draft_vocab, "lengths": lengths}
