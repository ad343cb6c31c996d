"""The engines of one evaluation, one after the other: the target alone on every set (target_alone,
the reference each draft must equal) and each draft in its speculative decoding (measure_draft)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from draftline.artifacts import acceptance as record
from draftline.runtime.vllm_engine import shutdown
from draftline.stages.evaluate.counters import acceptance
from draftline.stages.evaluate.engines import counted_one_by_one, engine_for, timed_generate, warm_up
from draftline.stages.evaluate.latency import as_row, batch1_latency, batch1_prompt_count, batch1_runs
from draftline.stages.evaluate.lossless import check_lossless
from draftline.stages.evaluate.per_prompt import check_per_prompt, separate_calls_agree, spread
from draftline.stages.evaluate.prompts import Prompt, fitting_prompts
from draftline.stages.evaluate.settings import EvaluateSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetAlone:
    """The target alone on every set, what each draft is measured against: its tokenizer, the
    prompts left out of each set (no room for max_new_tokens) and each set's reference run (its
    greedy tokens, which every draft's outputs must equal, and its rate)."""

    target_dir: str | Path
    settings: EvaluateSettings
    chat_template: str | None
    tokenizer: object
    skipped: dict[str, list[str]]
    reference: dict[str, dict]


def target_alone(
    target_dir, sets: dict[str, list[Prompt]], settings: EvaluateSettings, chat_template: str | None
) -> TargetAlone:
    """The target alone on every set (`sets` keeps the prompts that fit)."""
    started = time.monotonic()
    llm = engine_for(target_dir, settings)
    log.info("target alone: loaded in %.1f s", time.monotonic() - started)
    tokenizer = llm.get_tokenizer()
    skipped = {}
    for name in list(sets):
        sets[name], skipped[name] = fitting_prompts(tokenizer, sets[name], settings, chat_template)
        if skipped[name]:
            log.warning("%s: %d prompts left out: prompt + max_new_tokens exceeds max_model_len=%d: %s",
                        name, len(skipped[name]), settings.max_model_len, skipped[name])
        if not sets[name]:
            raise ValueError(f"{name}: no prompt fits max_model_len={settings.max_model_len} with {settings.max_new_tokens} new tokens")
    warm_up(llm, next(iter(sets.values()))[0], chat_template, settings.chat_template_kwargs)
    reference = {name: timed_generate(llm, prompts, settings, chat_template) for name, prompts in sets.items()}
    for name, prompts in sets.items():  # then the set's first prompts at batch 1 (evaluate.batch1_prompts)
        reference[name]["batch1"] = batch1_runs(llm, prompts[: batch1_prompt_count(settings, len(prompts))], settings, chat_template)
    shutdown(llm)
    del llm
    for name, ref in reference.items():
        log.info("%s, target alone: %d prompts, %d prompt tokens, %d output tokens in %.1f s = %.1f tok/s",
                 name, len(sets[name]), ref["prompt_tokens"], ref["output_tokens"], ref["seconds"], ref["output_tokens_per_s"])
    return TargetAlone(target_dir, settings, chat_template, tokenizer, skipped, reference)


def checkpoint_record(checkpoint: str | Path) -> dict:
    from draftline.lineage.content_hash import sha256_file

    weights = Path(checkpoint) / "model.safetensors"
    return {"path": str(checkpoint), "model_sha256": sha256_file(weights) if weights.is_file() else None}


def measure_draft(alone: TargetAlone, draft: str, checkpoint, sets: dict[str, list[Prompt]]) -> dict[str, dict]:
    """One draft in the target's speculative decoding on each of `sets`: set name -> its numbers.
    Its outputs are compared with the target's alone, prompt by prompt (check_lossless: within
    `evaluate.lossless_tolerance`, each differing prompt counted in the set's `lossless`)."""
    settings, chat_template, reference = alone.settings, alone.chat_template, alone.reference
    k = settings.num_speculative_tokens
    load_started = time.monotonic()
    llm = engine_for(alone.target_dir, settings, draft=checkpoint)
    log.info("%s draft %s: loaded in %.1f s", draft, checkpoint, time.monotonic() - load_started)
    warm_up(llm, next(iter(sets.values()))[0], chat_template, settings.chat_template_kwargs)
    results = {}
    for name, prompts in sets.items():
        run = timed_generate(llm, prompts, settings, chat_template)
        lossless = check_lossless(prompts, reference[name]["token_ids"], run["token_ids"], draft, alone.tokenizer,
                                  tolerance=settings.lossless_tolerance)
        numbers = acceptance(run["counters"], k)
        ids, where = [p.id for p in prompts], f"{name}, {draft} draft"
        if settings.per_prompt_counts == "separate_calls":  # each prompt again, in a call of its own
            # a counting pass: lossless is checked on the batched call (its outputs are compared in
            # separate_calls_agree; a GPU batch may round otherwise than one prompt alone)
            one = counted_one_by_one(llm, prompts, settings, chat_template)
            # those calls are batch 1: the latency's rows, no pass of their own
            batch1 = [as_row(p.id, run) for p, run in zip(prompts, one["runs"], strict=True)]
            per_request = one["per_request"]
            prompts_counted = record.per_prompt(ids, per_request, k)
            how_counted = {"per_prompt_counts": separate_calls_agree(prompts_counted, run, one["token_ids"], where)}
        else:
            per_request = run["per_request"]
            prompts_counted = record.per_prompt(ids, per_request, k)
            check_per_prompt(prompts_counted, run["counters"], where)
            how_counted = {}
            batch1 = batch1_runs(llm, prompts[: len(reference[name]["batch1"])], settings, chat_template)
        latency = batch1_latency(reference[name]["batch1"], batch1[: len(reference[name]["batch1"])], seed=settings.seed)
        results[name] = {
            **numbers,
            "spread": spread(per_request, seed=settings.seed),
            **how_counted,
            "output_tokens_per_s": run["output_tokens_per_s"],
            "speedup": round(run["output_tokens_per_s"] / reference[name]["output_tokens_per_s"], 3),
            "output_tokens": run["output_tokens"],
            "seconds": run["seconds"],
            "counters": run["counters"],
            "per_prompt": prompts_counted,
            "batch1": latency,
            "lossless": lossless,
        }
        log.info(
            "%s, %s draft: mean acceptance length %.3f (95%% bootstrap %s), acceptance rate %.3f, per position %s, "
            "%.1f tok/s (target alone %.1f); outputs identical to the target's on %d of %d prompts",
            name, draft, numbers["mean_acceptance_length"], (results[name]["spread"] or {}).get("bootstrap_95"),
            numbers["acceptance_rate"], [round(x, 3) for x in numbers["acceptance_per_position"]],
            run["output_tokens_per_s"], reference[name]["output_tokens_per_s"], lossless["identical"], len(prompts),
        )
        if latency:
            log.info("%s, %s draft at batch 1 (%d prompts, each alone): %.3f ms per output token (target alone %.3f), "
                     "speed-up %.3f (paired 95%% bootstrap %s); a speculative step %s ms = %s target steps, %s tokens",
                     name, draft, latency["prompts"], latency["ms_per_output_token"]["with_draft"],
                     latency["ms_per_output_token"]["target_alone"], latency["speedup"], latency["bootstrap_95"],
                     latency["speculative_step"]["ms"], latency["speculative_step"]["in_target_steps"],
                     latency["speculative_step"]["output_tokens_per_step"])
    shutdown(llm)
    del llm
    return results
