"""Training with speculators' real Trainer on the tiny target (CPU), resume, final/, vLLM load.

Inputs are built here the way the earlier stages build them: an arrow dataset
(input_ids, loss_mask, seq_len), speculators' token_freq.pt, and hidden-state files
from a transformers forward pass (vLLM layer id i = output of decoder layer i).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
AUX = [2, 4, 5]
DRAFT_VOCAB = 64
TOPICS = [
    "the capital of France",
    "how a hash table works",
    "speculative decoding",
    "the sea",
    "numbers and math",
    "a draft model",
    "unicode text",
    "python functions",
]


def conversations(n: int) -> list[list[dict]]:
    rows = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        rows.append(
            [
                {"role": "user", "content": f"Tell me about {topic}. ({i})"},
                {"role": "assistant", "content": f"Here is something about {topic}: " + "the sea is wide. " * (1 + i % 4)},
            ]
        )
    return rows


def build_dataset(target: Path, out: Path, rows: int = 16):
    """speculators' arrow layout; loss on the assistant turn only."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    ids, masks = [], []
    for conv in conversations(rows):
        prompt = tok.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(conv, tokenize=False)
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        full_ids = tok(full, add_special_tokens=False)["input_ids"]
        ids.append(full_ids)
        masks.append([0] * n_prompt + [1] * (len(full_ids) - n_prompt))
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": masks, "seq_len": [len(x) for x in ids]})
    ds.set_format("torch")
    ds.save_to_disk(str(out))
    return ds


def write_hidden_states(target: Path, dataset, out: Path, aux: list[int]) -> None:
    """hs_<row>.safetensors: hidden_states [seq, len(aux)+1, hidden] (aux + last layer), token_ids."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    layers = model.model.layers
    ids_wanted = [*aux, len(layers)]
    captured: dict[int, torch.Tensor] = {}
    hooks = [
        layers[i - 1].register_forward_hook(
            lambda _m, _in, output, i=i: captured.__setitem__(i, output[0] if isinstance(output, tuple) else output)
        )
        for i in ids_wanted
    ]
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for row in range(len(dataset)):
            input_ids = dataset[row]["input_ids"]
            model(input_ids=input_ids[None])
            states = torch.stack([captured[i][0] for i in ids_wanted], dim=1).contiguous()
            save_file({"hidden_states": states, "token_ids": input_ids.clone()}, str(out / f"hs_{row}.safetensors"))
    for hook in hooks:
        hook.remove()


@pytest.fixture(scope="module")
def train_inputs(tiny_model, tmp_path_factory):
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    from draftline.speculator_config import write_speculator_config
    from draftline.train import TrainInputs
    from draftline.vocab import write_vocab

    root = tmp_path_factory.mktemp("train-inputs")
    ds = build_dataset(tiny_model, root / "tokenized" / "dataset")
    save_token_frequency_distribution(ds, root / "tokenized" / "token_freq.pt")
    write_hidden_states(tiny_model, ds, root / "hidden_states" / "all", AUX)
    (root / "layer_ids.json").write_text(json.dumps({"aux": AUX, "extracted": [*AUX, 8], "num_hidden_layers": 8}))
    vocab = root / "vocab"
    write_vocab(root / "tokenized" / "token_freq.pt", tiny_model, DRAFT_VOCAB,
                vocab / "d2t.npy", vocab / "t2d.npy", vocab / "summary.json")  # fmt: skip
    write_speculator_config(root / "config", tiny_model, root / "layer_ids.json", DRAFT_VOCAB, num_layers=1)
    return TrainInputs(
        config_dir=root / "config",
        dataset=root / "tokenized" / "dataset",
        hidden_states=root / "hidden_states" / "all",
        d2t=vocab / "d2t.npy",
        t2d=vocab / "t2d.npy",
        layer_ids=root / "layer_ids.json",
        target=str(tiny_model),
    )
