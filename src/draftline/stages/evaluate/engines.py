"""The target in vLLM, alone or with a draft served the way its algorithm says (engine_for), and
one timed, counted greedy call over a set's prompts (timed_generate, after warm_up)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftline import algorithms
from draftline.runtime.vllm_engine import has_cuda, target_llm, vllm_has_engine_arg
from draftline.stages.evaluate.counters import GENERATION_TOKENS, counter_delta, read_counters, request_metrics
from draftline.stages.evaluate.prompts import Prompt
from draftline.stages.evaluate.settings import EvaluateSettings


def engine_for(target_dir: str | Path, settings: EvaluateSettings, draft: str | Path | None = None):
    """The target in vLLM (engine.target_llm), with `draft` served the way its algorithm says,
    and the counters evaluation reads."""
    extra = {}
    if draft is not None:
        config = Path(draft) / "config.json"
        config_json = json.loads(config.read_text())
        algorithm = algorithms.of_config(config_json, str(config))
        check_vllm_serves(algorithm, config_json, draft)
        if algorithm.not_served_on_cpu and not has_cuda():
            raise RuntimeError(f"{draft}: a {algorithm.name} draft cannot be evaluated on this machine: "
                               f"{algorithm.not_served_on_cpu}. Evaluate it on a GPU (docs/cluster.md).")
        extra["speculative_config"] = algorithm.speculative_config(draft, settings.num_speculative_tokens)
        # per-prompt acceptance, for the spread of each set's figure (where this vLLM keeps it; with
        # per_prompt_counts separate_calls each prompt's own call counts it: counted_one_by_one)
        if settings.per_prompt_counts == "vllm" and vllm_has_engine_arg("per_request_spec_decode_metrics"):
            extra["per_request_spec_decode_metrics"] = "summary"
    # the spec-decode counters are only kept with stats on
    return target_llm(target_dir, settings, disable_log_stats=False, **extra)


def check_vllm_serves(algorithm, config: dict, draft: str | Path) -> None:
    """Before an engine loads: the installed vLLM's own speculators reader (what vLLM runs on the
    draft's config.json when it loads it) knows the draft's type, and serves it as it was trained
    (`algorithm.serving_problem`). vLLM 0.26 knows no dflash2, serves a DSpark draft with its
    anchor as the bonus token whatever the config says, and cannot load one whose layers are fewer
    or more than its aux layers."""
    import copy

    import vllm
    from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    kind = config.get("speculators_model_type")
    if kind not in SUPPORTED_SPECULATORS_TYPES:
        raise RuntimeError(
            f"{draft}: vLLM {vllm.__version__} does not serve {kind} drafts (its speculators reader knows "
            f"{', '.join(sorted(SUPPORTED_SPECULATORS_TYPES))}): evaluate and serve it with a vLLM that does "
            "(dflash2: vLLM 0.32, the vllm0.32 GPU lock, requirements/README.md), or train another draft.algorithm"
        )
    served = SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(config))
    problem = algorithm.serving_problem(config, served, vllm.__version__)
    if problem:
        raise RuntimeError(f"{draft}: vLLM {vllm.__version__} would serve this {algorithm.name} draft {problem}")


def timed_generate(llm, prompts: list[Prompt], settings: EvaluateSettings, chat_template: str | None) -> dict:
    """Every prompt in one batched greedy call, timed and counted (the engine is warm: see
    `warm_up`). Per-request spec-decode metrics are kept when the engine records them."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=settings.max_new_tokens)
    before = read_counters(llm.get_metrics())
    started = time.perf_counter()
    outputs = llm.chat([p.messages for p in prompts], params, use_tqdm=False, chat_template=chat_template,
                       chat_template_kwargs=settings.chat_template_kwargs or None)
    seconds = time.perf_counter() - started
    delta = counter_delta(before, read_counters(llm.get_metrics()))
    token_ids = [list(o.outputs[0].token_ids) for o in outputs]
    output_tokens = sum(len(t) for t in token_ids)
    if delta[GENERATION_TOKENS] != output_tokens:
        raise RuntimeError(
            f"vLLM counted {delta[GENERATION_TOKENS]} generated tokens but returned {output_tokens}: "
            "its counters do not describe this run"
        )
    per_request = [getattr(o.outputs[0], "spec_decode_metrics", None) for o in outputs]
    return {
        "token_ids": token_ids,
        "prompt_tokens": sum(len(o.prompt_token_ids or []) for o in outputs),
        "output_tokens": output_tokens,
        "seconds": round(seconds, 3),
        "output_tokens_per_s": round(output_tokens / seconds, 2) if seconds else None,
        "counters": delta,
        "per_request": [m.to_dict() if m is not None else None for m in per_request],
    }


def counted_one_by_one(llm, prompts: list[Prompt], settings: EvaluateSettings, chat_template: str | None) -> dict:
    """Each prompt in a greedy call of its own (timed_generate of one prompt), its spec-decode
    counts the engine's counters' difference around that call, in the shape of vLLM's per-request
    metrics (evaluate.per_prompt_counts: separate_calls, for a vLLM that keeps none). Batch 1: the
    set's batched call stays the timed one and the set's figure."""
    runs = [timed_generate(llm, [prompt], settings, chat_template) for prompt in prompts]
    return {"per_request": [request_metrics(run["counters"], settings.num_speculative_tokens) for run in runs],
            "token_ids": [run["token_ids"][0] for run in runs], "runs": runs}


def warm_up(llm, prompt: Prompt, chat_template: str | None, template_kwargs: dict | None = None) -> None:
    from vllm import SamplingParams

    llm.chat([prompt.messages], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False, chat_template=chat_template,
             chat_template_kwargs=template_kwargs or None)
