"""What every CUDA measurement shares: the target sizes, the results file, the device and host
facts, and the random target and dataset the measurements run on.

The header (command, commit, versions) comes from the benchmarks' one harness,
benchmarks/record_run.py.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness

import record_run  # noqa: E402

from draftline.runtime.atomic import atomic_file  # noqa: E402

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


class Results:
    def __init__(self, out: Path, meta: dict):
        self.out = out
        self.data = {"meta": meta, "stages": {}, "errors": {}}

    def put(self, stage: str, value: dict) -> None:
        self.data["stages"][stage] = value
        self.save()

    def error(self, stage: str, err: BaseException) -> None:
        self.data["errors"][stage] = "".join(traceback.format_exception(err))[-4000:]
        log.error("stage %s failed: %s", stage, err)
        self.save()

    def save(self) -> None:
        with atomic_file(self.out / "results.json") as f:  # rewritten after every stage: never half-written
            f.write(json.dumps(self.data, indent=1, default=str) + "\n")


class GpuMemoryPoller:
    """Peak `memory.used` per GPU (MiB) from nvidia-smi, sampled every 0.25 s."""

    def __init__(self):
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=5,
                ).stdout
                for line in out.strip().splitlines():
                    i, used = (int(x) for x in line.split(","))
                    self.peak[i] = max(self.peak.get(i, 0), used)
            except Exception:  # noqa: BLE001 - no nvidia-smi on CPU
                return
            self._stop.wait(0.25)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def versions() -> dict:
    """Python's and the packages' versions (the harness's lookup), vLLM's where it is importable, and
    torch's CUDA."""
    out = record_run.versions("torch", "transformers", "speculators", "safetensors", "datasets", "hs-connectors")
    if (vllm := record_run.vllm_version()) is not None:
        out["vllm"] = vllm
    out["cuda"] = torch.version.cuda
    return out


def gpu_info() -> dict:
    if not torch.cuda.is_available():
        return {"device": "cpu"}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    return {"device": "cuda", "count": torch.cuda.device_count(), "nvidia_smi": smi,
            "name": torch.cuda.get_device_name(0),
            "sms": torch.cuda.get_device_properties(0).multi_processor_count}


def git_commit() -> str | None:
    """The commit measured: $BENCH_COMMIT (the device machine gets a copy of the tree, no git),
    else this checkout's (the harness's `git_commit`)."""
    return os.environ.get("BENCH_COMMIT") or record_run.git_commit()


def host_info() -> dict:
    """CPU count, memory and the dirty-page limits (the stage never syncs: its files go to the
    page cache first)."""
    out: dict = {"cpus": os.cpu_count()}
    for name in ("dirty_ratio", "dirty_background_ratio", "dirty_bytes"):
        try:
            out[f"vm.{name}"] = Path(f"/proc/sys/vm/{name}").read_text().strip()
        except OSError:
            pass
    try:
        out["MemTotal"] = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split(":")[1].strip()
    except (OSError, StopIteration):
        pass
    return out


def summarize(vals: list[float]) -> dict:
    v = sorted(vals)
    return {"n": len(v), "min": v[0],
            "median": v[len(v) // 2] if len(v) % 2 else round((v[len(v) // 2 - 1] + v[len(v) // 2]) / 2, 3),
            "max": v[-1], "all": vals}


def meminfo(*keys: str) -> dict:
    try:
        rows = dict(x.split(":", 1) for x in Path("/proc/meminfo").read_text().splitlines())
        return {k: rows[k].strip() for k in keys if k in rows}
    except OSError:
        return {}


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
