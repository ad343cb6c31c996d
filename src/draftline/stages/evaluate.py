"""Acceptance of a draft in vLLM's own speculative decoding, on named prompt sets.

The sets are the validation prompts (for choosing settings), the test prompts (the figures to
report: no choice looks at them) and any files the user names in `evaluate.prompt_sets`. One
evaluation loads the target three times, one after the other, and asks every set with the
same greedy settings: alone (the reference outputs and the speed without speculation), with
the trained draft, and with an untrained draft of the same config (the baseline). All
acceptance numbers come from vLLM's own spec-decode counters (`LLM.get_metrics()`), read
before and after each set's timed `generate`, so warm-up and earlier sets never leak in:

- acceptance rate = accepted tokens / draft tokens
- mean acceptance length = 1 + accepted tokens / drafts (tokens emitted per target step)
- acceptance per position i = accepted at position i / drafts

The spread of a set's mean acceptance length comes from vLLM's per-request spec-decode
metrics (`per_request_spec_decode_metrics="summary"`): a bootstrap over the set's prompts
(resampled with a fixed seed) gives a 95% interval, and the per-prompt values their range.
Each prompt's counts are kept (`per_prompt`, draftline.artifacts.acceptance), so drafts
measured on the same prompts compare prompt by prompt: the trained draft against the untrained
one here (`trained_minus_untrained`, a paired bootstrap), two evaluations with
`benchmarks/compare_acceptance.py`.

Greedy speculative decoding is lossless: every speculative output must be token-identical
to the target's own; the first prompt where it is not stops the evaluation (LosslessError).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftline import algorithms
from draftline.artifacts import acceptance as record
from draftline.artifacts.acceptance import RESAMPLES, interval_95, resamples
from draftline.planning.config_schema import default
from draftline.runtime.vllm_engine import EngineSettings, has_cuda, shutdown, target_llm, vllm_has_engine_arg
from draftline.sources import read_first_turns

log = logging.getLogger(__name__)

# vLLM's counter names (vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py)
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PROMPT_TOKENS, GENERATION_TOKENS)


class LosslessError(RuntimeError):
    """A greedy speculative output differs from the target's own greedy output."""


@dataclass(frozen=True)
class EvaluateSettings(EngineSettings):
    """The `evaluate:` config block; the target loads as in the other stages (EngineSettings)."""

    num_speculative_tokens: int = default("evaluate", "num_speculative_tokens")
    max_new_tokens: int = default("evaluate", "max_new_tokens")
    max_prompts: int | None = default("evaluate", "max_prompts")  # per set
    chat_template: str | None = None  # path to a Jinja template replacing the tokenizer's
    # target.chat_template_kwargs: the template's variables (e.g. enable_thinking)
    chat_template_kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict]


# ---------------------------------------------------------------- inputs


HEADLINE_SET = "test"


def read_prompts(path: str | Path, max_prompts: int | None = None) -> list[Prompt]:
    """A prompt set's rows as first-turn chat prompts (system + first user turn, as
    regeneration's turn 1); any format the prompts stage reads."""
    rows = read_first_turns(str(path))
    if max_prompts is not None:
        rows = rows[:max_prompts]
    return [Prompt(row_id, messages) for row_id, messages in rows]


def make_untrained_draft(
    config_dir: str | Path, d2t: str | Path, t2d: str | Path, out_dir: str | Path,
    target: str | Path | None = None, seed: int = 0,
) -> Path:
    """The baseline: a freshly initialized draft of the trained one's config and vocab maps.

    Built by the code path speculators' Trainer takes for a config-only `--from-pretrained`
    folder (random decoder, the verifier's embeddings, d2t/t2d loaded), then saved the way
    its `--dry-run` saves one, so vLLM loads it exactly like a trained checkpoint.
    """
    import numpy as np
    import torch
    from speculators.train.cli import _build_from_config_only, set_seed

    from draftline.runtime.atomic import atomic_dir

    config = json.loads((Path(config_dir) / "config.json").read_text())
    algorithm = algorithms.of_config(config, str(Path(config_dir) / "config.json"))
    set_seed(seed)
    d2t_t = torch.from_numpy(np.load(d2t))
    t2d_t = torch.from_numpy(np.load(t2d))
    model = _build_from_config_only(
        algorithm.model_class(), str(config_dir), t2d=t2d_t, d2t=d2t_t,
        verifier_name_or_path=str(target) if target else None,
    )
    with atomic_dir(out_dir) as staging:
        model.save_pretrained(str(staging))
        algorithms.check_checkpoint(staging, algorithm, algorithm.config_facts(config))
        (staging / "draftline_provenance.json").write_text(
            json.dumps({"untrained": True, "algorithm": algorithm.name, "seed": seed, "config": str(config_dir),
                        "d2t": str(d2t), "t2d": str(t2d)}, indent=1) + "\n"
        )
    log.info("untrained draft (seed %d) written to %s", seed, out_dir)
    return Path(out_dir)


# ---------------------------------------------------------------- vLLM counters


def read_counters(metrics) -> dict:
    """vLLM's counters this evaluation uses, summed over label sets (engines)."""
    counters: dict = {name: 0 for name in COUNTERS}
    per_pos: list[int] = []
    for metric in metrics:
        if metric.name in counters and hasattr(metric, "value"):
            counters[metric.name] += int(metric.value)
        elif metric.name == ACCEPTED_PER_POS and hasattr(metric, "values"):
            for i, value in enumerate(metric.values):
                if i == len(per_pos):
                    per_pos.append(0)
                per_pos[i] += int(value)
    counters[ACCEPTED_PER_POS] = per_pos
    return counters


def counter_delta(before: dict, after: dict) -> dict:
    delta = {name: after[name] - before[name] for name in COUNTERS}
    b, a = before[ACCEPTED_PER_POS], after[ACCEPTED_PER_POS]
    b = b + [0] * (len(a) - len(b))
    delta[ACCEPTED_PER_POS] = [x - y for x, y in zip(a, b, strict=False)]
    return delta


def acceptance(counters: dict, k: int) -> dict:
    """Acceptance numbers from one run's counter deltas; checks vLLM's counters agree."""
    drafts, draft_tokens, accepted = counters[DRAFTS], counters[DRAFT_TOKENS], counters[ACCEPTED]
    per_pos = counters[ACCEPTED_PER_POS]
    if drafts <= 0 or draft_tokens <= 0:
        raise RuntimeError(
            f"vLLM counted no drafts ({DRAFTS}={drafts}, {DRAFT_TOKENS}={draft_tokens}): "
            "speculative decoding did not run; see the engine log above"
        )
    if not (accepted <= draft_tokens <= drafts * k) or sum(per_pos) != accepted or len(per_pos) > k:
        raise RuntimeError(f"vLLM's spec-decode counters disagree with each other (k={k}): {counters}")
    return {
        "acceptance_rate": accepted / draft_tokens,
        "mean_acceptance_length": 1 + accepted / drafts,
        "acceptance_per_position": [n / drafts for n in per_pos] + [0.0] * (k - len(per_pos)),
    }


# ---------------------------------------------------------------- the runs


def check_lossless(prompts: list[Prompt], reference: list[list[int]], speculative: list[list[int]], draft: str, tokenizer=None) -> None:
    """Raise LosslessError naming the first prompt whose speculative output differs."""
    if len(reference) != len(prompts) or len(speculative) != len(prompts):
        raise LosslessError(
            f"{draft} draft: {len(speculative)} speculative and {len(reference)} reference outputs for {len(prompts)} prompts"
        )
    for prompt, ref, spec in zip(prompts, reference, speculative, strict=True):
        if list(ref) == list(spec):
            continue
        at = next((i for i, (a, b) in enumerate(zip(ref, spec, strict=False)) if a != b), min(len(ref), len(spec)))

        def show(ids, at=at):
            return repr(tokenizer.decode(ids[max(0, at - 8) : at + 8])) if tokenizer else str(list(ids[max(0, at - 8) : at + 8]))

        raise LosslessError(
            f"speculative decoding with the {draft} draft changed the greedy output of held-out prompt "
            f"{prompt.id!r} at output token {at} (target alone: {len(ref)} tokens, around it {show(ref)}; "
            f"with the draft: {len(spec)} tokens, around it {show(spec)}). Greedy speculative decoding must be "
            "lossless: this is a vLLM/numerics problem, not a bad draft; check the vLLM version and dtype."
        )


def engine_for(target_dir: str | Path, settings: EvaluateSettings, draft: str | Path | None = None):
    """The target in vLLM (engine.target_llm), with `draft` served the way its algorithm says,
    and the counters evaluation reads."""
    extra = {}
    if draft is not None:
        config = Path(draft) / "config.json"
        algorithm = algorithms.of_config(json.loads(config.read_text()), str(config))
        if algorithm.not_served_on_cpu and not has_cuda():
            raise RuntimeError(f"{draft}: a {algorithm.name} draft cannot be evaluated on this machine: "
                               f"{algorithm.not_served_on_cpu}. Evaluate it on a GPU (docs/cluster.md).")
        extra["speculative_config"] = algorithm.speculative_config(draft, settings.num_speculative_tokens)
        # per-prompt acceptance, for the spread of each set's figure (where this vLLM keeps it)
        if vllm_has_engine_arg("per_request_spec_decode_metrics"):
            extra["per_request_spec_decode_metrics"] = "summary"
    # the spec-decode counters are only kept with stats on
    return target_llm(target_dir, settings, disable_log_stats=False, **extra)


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


def warm_up(llm, prompt: Prompt, chat_template: str | None, template_kwargs: dict | None = None) -> None:
    from vllm import SamplingParams

    llm.chat([prompt.messages], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False, chat_template=chat_template,
             chat_template_kwargs=template_kwargs or None)


def spread(per_request: list[dict | None], seed: int = 0, count: int = RESAMPLES) -> dict | None:
    """Per-prompt mean acceptance lengths (min/median/max) and a bootstrap 95% interval of the
    set's mean acceptance length (accepted / steps summed over prompts resampled with
    replacement), from vLLM's per-request metrics; None when the engine kept none."""
    rows = [(m["num_accepted_draft_tokens"], m["num_spec_steps"]) for m in per_request if m and m["num_spec_steps"]]
    if len(rows) < 2:
        return None
    per_prompt = sorted(1 + a / n for a, n in rows)
    estimates = [
        1 + sum(rows[i][0] for i in sample) / sum(rows[i][1] for i in sample) for sample in resamples(len(rows), seed, count)
    ]
    return {
        "prompts": len(rows),
        "per_prompt_mean_acceptance_length": {
            "min": round(per_prompt[0], 4),
            "median": round(per_prompt[len(per_prompt) // 2], 4),
            "max": round(per_prompt[-1], 4),
        },
        "bootstrap_95": interval_95(estimates),
        "bootstrap": f"{count} resamples of the set's prompts, seed {seed}",
    }


def check_per_prompt(block: dict | None, counters: dict, where: str) -> None:
    """The per-prompt counts must add up to the set's counters: both are vLLM's record of the
    same generate call, and a paired comparison trusts the rows."""
    if block is None:
        log.warning("%s: vLLM returned no per-request spec-decode metrics for some prompt: no per-prompt counts", where)
        return
    summed = record.totals(block)
    per_pos = counters[ACCEPTED_PER_POS]
    expected = {"drafts": counters[DRAFTS], "draft_tokens": counters[DRAFT_TOKENS], "accepted": counters[ACCEPTED],
                "accepted_per_position": per_pos + [0] * (len(summed["accepted_per_position"]) - len(per_pos))}
    if summed != expected:
        raise RuntimeError(
            f"{where}: vLLM's per-request spec-decode metrics sum to {summed}, its counters for the same call to "
            f"{expected}: they do not describe the same run"
        )


def trained_minus_untrained(drafts: dict, name: str, seed: int) -> dict | None:
    """The paired difference of the trained and the untrained draft on one set (the same prompts,
    the same resamples), when both were measured with per-prompt counts."""
    trained, untrained = drafts.get("trained", {}).get("per_prompt"), drafts.get("untrained", {}).get("per_prompt")
    if not (trained and untrained):
        return None
    difference = record.paired_difference(trained, untrained, seed=seed, names=("trained", "untrained"))
    log.info("%s, trained - untrained: mean acceptance length %+.4f (paired 95%% bootstrap %s)",
             name, difference["mean_acceptance_length"], difference["bootstrap_95"])
    return difference


def fitting_prompts(
    tokenizer, prompts: list[Prompt], settings: EvaluateSettings, chat_template: str | None
) -> tuple[list[Prompt], list[str]]:
    """Prompts with room for max_new_tokens within max_model_len, and the ids left out."""
    kept, skipped = [], []
    for prompt in prompts:
        text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True, chat_template=chat_template,
                                             **settings.chat_template_kwargs)
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n + settings.max_new_tokens <= settings.max_model_len:
            kept.append(prompt)
        else:
            skipped.append(prompt.id)
    return kept, skipped


def evaluate(
    target_dir: str | Path,
    prompt_sets: dict[str, str | Path],
    drafts: dict[str, str | Path],
    out_json: str | Path,
    settings: EvaluateSettings,
    baseline: str | None = None,
) -> dict:
    """Measure each draft (name -> checkpoint folder) against the target alone on every prompt
    set (name -> file); write out_json.

    `drafts` is typically {"trained": final/, "untrained": baseline/}: all in this one call, on
    the same prompts, with the same settings. Empty sets are skipped (named in the result).
    The draft named `baseline` (the untrained draft: it accepts next to nothing by construction)
    is measured on the headline set only, where the trained draft is compared against it; the
    named sets and validation then cost one pass each instead of two.
    """
    from draftline.runtime.atomic import atomic_file

    started = time.monotonic()
    chat_template = Path(settings.chat_template).read_text(encoding="utf-8") if settings.chat_template else None
    sets, empty = _read_sets(prompt_sets, settings)
    headline = HEADLINE_SET if HEADLINE_SET in sets else next(iter(sets))
    log.info("prompt sets %s; target %s; drafts %s; %s", {n: len(p) for n, p in sets.items()}, target_dir, drafts, settings)
    alone = _target_alone(target_dir, sets, settings, chat_template)
    skipped, reference = alone.skipped, alone.reference

    results: dict[str, dict] = {name: {} for name in sets}
    checkpoints = {}
    for draft, checkpoint in drafts.items():
        checkpoints[draft] = _checkpoint_record(checkpoint)
        measured = {name: prompts for name, prompts in sets.items() if draft != baseline or name == headline}
        for name, numbers in _measure_draft(alone, draft, checkpoint, measured).items():
            results[name][draft] = numbers

    per_set = {
        name: {
            "source": str(prompt_sets[name]),
            "prompts": len(sets[name]),
            "prompts_left_out": skipped[name],
            "prompt_ids": [p.id for p in sets[name]],
            "prompt_tokens": reference[name]["prompt_tokens"],
            "output_tokens": reference[name]["output_tokens"],
            "target_alone": {
                "output_tokens_per_s": reference[name]["output_tokens_per_s"],
                "seconds": reference[name]["seconds"],
                "counters": reference[name]["counters"],
            },
            "drafts": results[name],
            "trained_minus_untrained": trained_minus_untrained(results[name], name, settings.seed),
        }
        for name in sets
    }
    summary = {
        "num_speculative_tokens": settings.num_speculative_tokens,
        "headline_set": headline,
        # the headline set's numbers, as before sets existed (the report and summaries read them)
        "prompts": per_set[headline]["prompts"],
        "drafts": per_set[headline]["drafts"],
        "sets": per_set,
        "empty_sets": empty,
        "checkpoints": checkpoints,
        "lossless": True,  # check_lossless raised otherwise
        "baseline": {"draft": baseline, "sets": [headline]} if baseline in drafts else None,
        "timing": "each set's prompts in one batched greedy generate call per engine, after a warm-up request",
        "settings": {key: value for key, value in asdict(settings).items() if key != "threads"},
        "seconds": round(time.monotonic() - started, 1),
    }
    with atomic_file(out_json, encoding="utf-8") as handle:
        handle.write(record.dumps(summary))
    return summary


def evaluate_set(target_dir: str | Path, prompt_set: tuple[str, str | Path], draft: tuple[str, str | Path],
                 out_json: str | Path, settings: EvaluateSettings) -> dict:
    """One prompt set (name, file) with one draft (name, checkpoint): a job of its own, so a new,
    edited or removed set reruns that set alone (its record: `evaluate`'s format with one set;
    `draftline.stages.evaluate_merge` gathers them). An empty set is recorded as empty, no engine
    loaded."""
    name, path = prompt_set
    if read_prompts(path, settings.max_prompts):
        return evaluate(target_dir, {name: path}, dict([draft]), out_json, settings)
    from draftline.runtime.atomic import atomic_file

    log.info("%s (%s): no prompts; recorded as an empty set", name, path)
    summary = {"num_speculative_tokens": settings.num_speculative_tokens, "headline_set": None, "prompts": 0,
               "drafts": {}, "sets": {}, "empty_sets": [name], "checkpoints": {}, "lossless": True, "baseline": None,
               "settings": {key: value for key, value in asdict(settings).items() if key != "threads"}, "seconds": 0.0}
    with atomic_file(out_json, encoding="utf-8") as handle:
        handle.write(record.dumps(summary))
    return summary


def evaluate_baseline(target_dir: str | Path, prompt_sets: dict[str, str | Path], untrained: str | Path,
                      out_json: str | Path, settings: EvaluateSettings) -> dict:
    """The untrained draft on the headline set: the first of `prompt_sets` (test, then validation)
    that holds prompts. It depends on the config and vocab maps, not on training: retraining
    reruns the sets, never the baseline."""
    name = next((n for n, path in prompt_sets.items() if read_prompts(path, 1)), next(iter(prompt_sets)))
    return evaluate_set(target_dir, (name, prompt_sets[name]), ("untrained", untrained), out_json, settings)


def _read_sets(prompt_sets: dict[str, str | Path], settings: EvaluateSettings) -> tuple[dict[str, list[Prompt]], list[str]]:
    """name -> its prompts (at most settings.max_prompts), and the names of the empty sets, left out."""
    sets = {name: read_prompts(path, settings.max_prompts) for name, path in prompt_sets.items()}
    empty = sorted(name for name, prompts in sets.items() if not prompts)
    sets = {name: prompts for name, prompts in sets.items() if prompts}
    if not sets:
        raise ValueError(
            f"no prompts to evaluate on in {dict(prompt_sets)}: set prompts.validation or prompts.test "
            "above 0, or name a non-empty file in evaluate.prompt_sets"
        )
    return sets, empty


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


def _target_alone(
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
    shutdown(llm)
    del llm
    for name, ref in reference.items():
        log.info("%s, target alone: %d prompts, %d prompt tokens, %d output tokens in %.1f s = %.1f tok/s",
                 name, len(sets[name]), ref["prompt_tokens"], ref["output_tokens"], ref["seconds"], ref["output_tokens_per_s"])
    return TargetAlone(target_dir, settings, chat_template, tokenizer, skipped, reference)


def _checkpoint_record(checkpoint: str | Path) -> dict:
    from draftline.lineage.content_hash import sha256_file

    weights = Path(checkpoint) / "model.safetensors"
    return {"path": str(checkpoint), "model_sha256": sha256_file(weights) if weights.is_file() else None}


def _measure_draft(alone: TargetAlone, draft: str, checkpoint, sets: dict[str, list[Prompt]]) -> dict[str, dict]:
    """One draft in the target's speculative decoding on each of `sets`: set name -> its numbers.
    Its outputs must equal the target's alone (lossless), prompt by prompt."""
    settings, chat_template, reference = alone.settings, alone.chat_template, alone.reference
    k = settings.num_speculative_tokens
    load_started = time.monotonic()
    llm = engine_for(alone.target_dir, settings, draft=checkpoint)
    log.info("%s draft %s: loaded in %.1f s", draft, checkpoint, time.monotonic() - load_started)
    warm_up(llm, next(iter(sets.values()))[0], chat_template, settings.chat_template_kwargs)
    results = {}
    for name, prompts in sets.items():
        run = timed_generate(llm, prompts, settings, chat_template)
        check_lossless(prompts, reference[name]["token_ids"], run["token_ids"], draft, alone.tokenizer)
        numbers = acceptance(run["counters"], k)
        prompts_counted = record.per_prompt([p.id for p in prompts], run["per_request"], k)
        check_per_prompt(prompts_counted, run["counters"], f"{name}, {draft} draft")
        results[name] = {
            **numbers,
            "spread": spread(run["per_request"], seed=settings.seed),
            "output_tokens_per_s": run["output_tokens_per_s"],
            "speedup": round(run["output_tokens_per_s"] / reference[name]["output_tokens_per_s"], 3),
            "output_tokens": run["output_tokens"],
            "seconds": run["seconds"],
            "counters": run["counters"],
            "per_prompt": prompts_counted,
        }
        log.info(
            "%s, %s draft: mean acceptance length %.3f (95%% bootstrap %s), acceptance rate %.3f, per position %s, "
            "%.1f tok/s (target alone %.1f); outputs identical to the target's on all %d prompts",
            name, draft, numbers["mean_acceptance_length"], (results[name]["spread"] or {}).get("bootstrap_95"),
            numbers["acceptance_rate"], [round(x, 3) for x in numbers["acceptance_per_position"]],
            run["output_tokens_per_s"], reference[name]["output_tokens_per_s"], len(prompts),
        )
    shutdown(llm)
    del llm
    return results
