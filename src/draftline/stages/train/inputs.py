"""The train step's input checks: the draft config, the vocab maps, the dataset and (offline)
every hidden-state file must fit together before any time is spent training."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftline import algorithms
from draftline.algorithms import ConfigFacts
from draftline.artifacts import layer_ids
from draftline.artifacts.hidden_states import file_name, read_manifest, validate_hidden_states
from draftline.settings import DEFAULTS, HiddenStateFormat
from draftline.stages.train.settings import TrainInputs

# speculators trains on these; safetensors' names for them
TRAINABLE_DTYPES = ("float32", "bfloat16")
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


@dataclass(frozen=True)
class InputFacts:
    """What the checks found that training needs."""

    rows: int  # the tokenized dataset's
    aux: list[int]  # the target layers the draft reads (layer_ids.json's aux)
    draft_vocab_size: int
    hidden_states_dtype: str  # float32 | bfloat16
    hidden_states_format: HiddenStateFormat = DEFAULTS.hidden_states.format  # full | fp8 (offline's hidden_states.format; online: full)
    algorithm: str = "eagle3"  # the draft config's speculators_model_type
    config: ConfigFacts | None = None  # what the published checkpoint's tensors are checked against


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read JSON ({err})") from err


def check_draft_config(inputs: TrainInputs) -> tuple[str, ConfigFacts, list[int]]:
    """The config folder holds only a config.json whose aux layers are layer_ids.json's; return
    its algorithm's name, its facts and the aux layers."""
    config_path = Path(inputs.config_dir) / "config.json"
    config = _read_json(config_path)
    extra = sorted(p.name for p in Path(inputs.config_dir).iterdir() if p.suffix in (".safetensors", ".bin"))
    if extra:
        raise ValueError(
            f"{inputs.config_dir} holds weights ({extra}); it must hold only config.json so "
            "speculators initialises a fresh draft from it"
        )
    algorithm = algorithms.of_config(config, str(config_path))
    facts = algorithm.config_facts(config)
    aux = layer_ids.read(inputs.layer_ids).aux
    if facts.aux_layer_ids != aux:
        raise ValueError(
            f"{config_path}: the draft reads target layers {facts.aux_layer_ids}, but {inputs.layer_ids} "
            f"has aux {aux}; rerun the speculator_config step"
        )
    return algorithm.name, facts, aux


def check_vocab_maps(inputs: TrainInputs, facts: ConfigFacts) -> None:
    import numpy as np

    d2t, t2d = np.load(inputs.d2t), np.load(inputs.t2d)
    draft_vocab, target_vocab = facts.draft_vocab_size, facts.target_vocab_size
    if d2t.shape != (draft_vocab,) or t2d.shape != (target_vocab,) or int(t2d.sum()) != draft_vocab:
        raise ValueError(
            f"vocab maps {inputs.d2t} {d2t.shape} / {inputs.t2d} {t2d.shape} (t2d has "
            f"{int(t2d.sum())} true) do not fit {Path(inputs.config_dir) / 'config.json'} (draft_vocab_size "
            f"{draft_vocab}, target vocab {target_vocab}); rerun the vocab and speculator_config steps"
        )


def count_rows(dataset: Path) -> int:
    from datasets import load_from_disk

    try:
        return len(load_from_disk(str(dataset)))
    except Exception as err:
        raise ValueError(f"{dataset}: cannot open the tokenized dataset ({err})") from err


def check_hidden_state_files(inputs: TrainInputs, rows: int, aux: list[int], hidden: int) -> tuple[str, str]:
    """Offline: every row's file exists, and every file holds the aux layers plus the last at the
    target's hidden size in a dtype speculators trains on; return (dtype, format)."""
    from safetensors import safe_open

    missing = [i for i in range(rows) if not (Path(inputs.hidden_states) / file_name(i)).exists()]
    if missing:
        raise ValueError(
            f"{inputs.hidden_states}: no hidden states for {len(missing)} of {rows} dataset rows "
            f"(e.g. hs_{missing[0]}.safetensors); rerun the hidden_states step"
        )
    first = Path(inputs.hidden_states) / file_name(0)
    with safe_open(str(first), framework="pt") as handle:
        states = handle.get_slice("hidden_states")
        shape, dtype = states.get_shape(), states.get_dtype()
    expected = [len(aux) + 1, hidden]
    if list(shape[1:]) != expected:
        raise ValueError(
            f"{first}: hidden_states has shape {shape}, expected [seq, {expected[0]}, {expected[1]}] "
            f"(aux layers {aux} + the last layer, target hidden size {hidden})"
        )
    if dtype == "F8_E4M3":
        # hidden_states.format fp8: speculators' FP8 reader dequantizes, and the Trainer casts to
        # the dtype the states were extracted in (the view's manifest records it)
        fmt, torch_dtype = "fp8", read_manifest(inputs.hidden_states)["dtype"]
    else:
        fmt, torch_dtype = "full", SAFETENSORS_DTYPES.get(dtype)
    if torch_dtype is None or torch_dtype == "float16":
        raise ValueError(f"{first}: hidden states are {dtype}; speculators trains on float32 or bfloat16 ones")
    # Every file, not just the first: a truncated file, foreign token ids or NaN/inf must stop
    # training before it starts. Shards holding a bad file are removed (with the view), so the
    # rerun re-extracts only those.
    validate_hidden_states(
        inputs.dataset, inputs.hidden_states, len(aux) + 1, hidden, dtype=torch_dtype, format=fmt,
        remove_bad_shards=True,
    )
    return torch_dtype, fmt


def check_inputs(inputs: TrainInputs, online_dtype: str | None = None) -> InputFacts:
    """Check that the inputs fit together before spending time; return what training needs.

    `online_dtype`: the server's dtype in online mode (no hidden-state files to check)."""
    algorithm, facts, aux = check_draft_config(inputs)
    check_vocab_maps(inputs, facts)
    rows = count_rows(inputs.dataset)
    if online_dtype is not None:
        if online_dtype not in TRAINABLE_DTYPES:
            raise ValueError(
                f"target.dtype {online_dtype}: the online server would make {online_dtype} hidden states; "
                "speculators trains on float32 or bfloat16 ones: set target.dtype"
            )
        # the server's connector writes full-precision files (hidden_states.format is offline's)
        dtype, fmt = online_dtype, "full"
    else:
        dtype, fmt = check_hidden_state_files(inputs, rows, aux, facts.hidden_size)
    return InputFacts(rows=rows, aux=aux, draft_vocab_size=facts.draft_vocab_size, hidden_states_dtype=dtype,
                      hidden_states_format=fmt, algorithm=algorithm, config=facts)
