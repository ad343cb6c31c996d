"""What the plan sizes from the config: a validated config's Plan (`plan_from_config`,
`config_estimate`), its training conversations and user turns before and after the prompts job,
the named sets' prompts, and the GPUs the train job asks for (`gpu_overrides`, `planned_train_gpus`)."""

from __future__ import annotations

import json
from pathlib import Path

from draftline.planning.sizing.estimate import Plan, estimate
from draftline.planning.sizing.shapes import Shape
from draftline.runtime.vllm_engine import planned_max_model_len
from draftline.settings import DraftlineConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def plan_from_config(config: dict, conversations: int, train_gpus: int = 1, device: str = "cuda",
                     user_turns: int | None = None) -> Plan:
    typed = DraftlineConfig.model_validate(config)  # a key left out is its default
    aux = config["hidden_states"]["layer_ids"]
    dtype = typed.target.dtype
    if dtype == "auto":  # draftline.planning.rule_params: float32 on the CPU, bfloat16 on CUDA
        dtype = "float32" if device == "cpu" else "bfloat16"
    prompts = config["prompts"]
    held_out = (prompts["validation"] or 0) + (prompts["test"] or 0)
    return Plan(
        conversations=conversations,
        max_seq_len=config["tokenize"]["max_seq_len"],
        max_new_tokens=config["regenerate"]["max_new_tokens"],
        epochs=config["train"]["epochs"],
        eval_prompts=held_out + named_set_prompts(config["evaluate"]),
        eval_headline_prompts=prompts["test"] or prompts["validation"] or 0,
        eval_new_tokens=config["evaluate"]["max_new_tokens"],
        aux_layers=3 if aux == "auto" else len(aux),
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        draft_vocab=config["vocab"]["draft_vocab_size"],
        regenerate=config["regenerate"]["enabled"],
        gpus_per_vllm_job=typed.target.vllm_ranks,
        train_gpus=train_gpus,
        regenerate_shards=config["regenerate"]["shards"],
        hidden_state_shards=config["hidden_states"]["shards"],
        filesystem_bytes_per_s=typed.sizing.filesystem_gb_per_s * 1e9,
        hidden_state_files=typed.hidden_states.mode == "offline",
        hidden_states_backend=config["hidden_states"]["backend"],
        user_turns=user_turns,
        context_len=planned_max_model_len(config),
    )


def config_estimate(shape: Shape, config: dict, conversations: int, train_gpus: int, device: str = "cuda",
                    measured: dict | None = None, user_turns: int | None = None, gpu: str = "H200") -> dict:
    """`estimate` for a validated config: what the plan's sizing line prints (for_config) and what
    docs/sizing.md's recipes table shows (recipes_table), one computation for both."""
    return estimate(shape, plan_from_config(config, conversations, train_gpus, device, user_turns), device, measured, gpu)


def named_set_prompts(evaluate: dict) -> int:
    """The prompts evaluation reads from the named sets (evaluate.prompt_sets), each capped at
    evaluate.max_prompts; a set that cannot be counted cheaply counts as its cap (or 0 without one:
    the plan checked its first rows, the job reads it)."""
    from draftline.sources import count_rows

    cap = evaluate.get("max_prompts")
    total = 0
    for path in (evaluate.get("prompt_sets") or {}).values():
        rows, _ = count_rows([str(path)])
        rows = cap if rows is None else rows
        total += min(rows, cap) if rows is not None and cap is not None else rows or 0
    return total


def planned_training_rows(config: dict, prompts_summary: str | Path | None = None) -> tuple[int | None, str | None]:
    """(training conversations, None) before tokenization, or (None, why they cannot be counted).
    The prompts job's count once it ran; before, the sources' rows (sources.count_rows) less the
    held-out prompts, capped at prompts.max_samples: an upper bound, since duplicates and
    rejected rows are known only to the prompts job."""
    if prompts_summary is not None and Path(prompts_summary).is_file():
        try:
            return int(json.loads(Path(prompts_summary).read_text())["train"]), None
        except (OSError, ValueError, KeyError, TypeError):
            pass  # being rewritten or damaged: count as before the prompts job
    from draftline.sources import count_rows

    prompts = config["prompts"]
    cap = prompts["max_samples"]
    rows, why_not = count_rows(prompts["sources"])
    if rows is None:
        if cap is None:
            return None, f"{why_not}; set prompts.max_samples to size the run before the prompts job"
        return int(cap), None
    rows = max(rows - (prompts["validation"] or 0) - (prompts["test"] or 0), 0)
    return (rows if cap is None else min(rows, int(cap))), None


def planned_user_turns(prompts_summary: str | Path | None) -> int | None:
    """The training conversations' user turns, as the prompts job counted them (None before it
    ran, or from a summary written before it counted them)."""
    try:
        return int(json.loads(Path(prompts_summary).read_text())["train_user_turns"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def gpu_overrides(settings: dict) -> dict[str, int | str | None]:
    """{rule: the `gpu` a profile or --set-resources sets (a Resource in Snakemake 9, or a plain
    value)} as plain values: an int, None when unset, the text of an expression only the job knows
    (e.g. "2 * attempt")."""
    out = {}
    for rule, gpu in settings.items():
        value = getattr(gpu, "value", gpu)
        try:
            out[rule] = None if value in (None, "") else int(value)
        except (TypeError, ValueError):
            out[rule] = str(value)
    return out


def planned_train_gpus(config: dict, gpu_overrides: dict[str, int | str | None]) -> tuple[int, int]:
    """(the train rule's own `gpu`: the Trainer's, plus the online server's; what it asks for with
    the profile's or --set-resources' setting). The plan and docs/sizing.md's recipes table read it
    here, so the two size the same training job."""
    hs = config["hidden_states"]
    default = 1 + (hs["online_server_gpus"] if hs["mode"] == "online" else 0)
    asked = gpu_overrides.get("train")
    return default, asked if isinstance(asked, int) else default  # an expression: checked in the job
