"""The target folder as the stages will read it, without loading weights (`read_target`): its
config, a tokenizer with a chat template, every safetensors file complete, and the weights'
size the memory check compares with the GPUs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}  # safetensors dtypes vLLM casts to the engine dtype


@dataclass(frozen=True)
class TargetFacts:
    """What the environment check reads of the target folder without loading weights."""

    folder: str
    hidden_size: int
    num_hidden_layers: int
    weight_files: int
    float_parameters: int  # in floating-point tensors (vLLM casts them to the engine dtype)
    other_bytes: int  # quantized tensors, kept as stored
    chat_template: bool

    def weights_bytes(self, dtype: str) -> int:
        return self.float_parameters * DTYPE_BYTES.get(dtype, 2) + self.other_bytes


class TargetUnreadable(ValueError):
    """The target folder cannot be read as the stages will read it."""


def _safetensors_header(path: Path) -> dict:
    """A safetensors file's header, checked against the file's size (a partial download or copy
    is shorter than its header says)."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        if not 0 < size < 100 * 1024**2:
            raise TargetUnreadable(f"{path}: not a safetensors file (header size {size}); fetch it again")
        header = json.loads(handle.read(size))
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((t["data_offsets"][1] for t in tensors.values()), default=0)
    actual = path.stat().st_size
    if actual < 8 + size + end:
        raise TargetUnreadable(
            f"{path}: {actual:,} bytes, but its header lists {8 + size + end:,}: a partial download or copy; "
            "fetch the target again (hf download <id> --revision <commit>)"
        )
    return tensors


def read_target(target_dir: str | Path, trust_remote_code: bool = False) -> TargetFacts:
    """The target folder as the stages read it: config (speculators' reader), tokenizer with a
    chat template, and every safetensors file (the index's too) complete; raises TargetUnreadable."""
    from transformers import AutoTokenizer

    from draftline.artifacts.target import dims

    folder = Path(target_dir)
    if not (folder / "config.json").is_file():
        raise TargetUnreadable(f"{folder}/config.json: missing or unreadable from this node (is the folder on a "
                               "filesystem the GPU nodes share? HF_HOME/HF_HUB_CACHE the same there?)")
    shape = dims(folder, trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        listed = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [name for name in listed if not (folder / name).is_file()]
        if missing:
            raise TargetUnreadable(f"{index} lists {len(missing)} file(s) missing from {folder} (e.g. {missing[0]}): "
                                   "an unfinished download; fetch the target again")
    if not files:
        raise TargetUnreadable(f"{folder}: no *.safetensors weights (the hidden-state check and speculators read them)")
    parameters = other = 0
    for path in files:
        for tensor in _safetensors_header(path).values():
            start, stop = tensor["data_offsets"]
            if tensor["dtype"] in FLOAT_DTYPES:
                parameters += math.prod(tensor["shape"])
            else:
                other += stop - start
    return TargetFacts(str(folder), shape.hidden_size, shape.num_hidden_layers, len(files), parameters, other,
                       tokenizer.chat_template is not None)
