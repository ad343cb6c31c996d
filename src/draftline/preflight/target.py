"""The target folder as the stages will read it, without loading weights (`read_target`): its
config, a tokenizer with a chat template, every safetensors file complete, and the weights'
size the memory check compares with the GPUs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# safetensors dtypes vLLM casts to the engine dtype, and their bytes per value
FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


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


def _tensor_sizes(path: Path) -> tuple[int, int]:
    """(values in floating-point tensors, bytes of the other tensors) of a safetensors file, from
    its header as safetensors reads it: it refuses a file its header does not cover to the byte
    (a partial download or copy), as vLLM's loader will."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as weights:
            tensors = [(t.get_dtype(), math.prod(t.get_shape())) for t in map(weights.get_slice, weights.keys())]
    except SafetensorError as error:
        raise TargetUnreadable(
            f"{path}: {path.stat().st_size:,} bytes that safetensors cannot read ({error}): a partial download or "
            "copy; fetch the target again (hf download <id> --revision <commit>)"
        ) from None
    # The tensors fill the file after its header (safetensors checked it), whose length is the
    # file's first 8 bytes: the other tensors hold what the floating-point ones leave.
    with open(path, "rb") as handle:
        data = path.stat().st_size - 8 - int.from_bytes(handle.read(8), "little")
    floats = [(n, FLOAT_DTYPES[dtype]) for dtype, n in tensors if dtype in FLOAT_DTYPES]
    return sum(n for n, _ in floats), data - sum(n * size for n, size in floats)


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
    sizes = [_tensor_sizes(path) for path in files]
    parameters, other = sum(p for p, _ in sizes), sum(o for _, o in sizes)
    return TargetFacts(str(folder), shape.hidden_size, shape.num_hidden_layers, len(files), parameters, other,
                       tokenizer.chat_template is not None)
