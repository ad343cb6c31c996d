"""The regeneration part (one engine, after the environment part): the target loads in vLLM
with the run's settings; the first `preflight.prompts` prompts of the run's prompt file are
answered by the regeneration stage's own code (`regenerate.regenerate`), the first
`preflight.rows` of them decoded greedily as evaluation does (reference.json, the reference
for the lossless check) and tokenized by the tokenization stage's own code
(`tokenization.tokenize`): the rows the later parts use."""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.artifacts.preflight import Check, not_run, passed, write_part
from draftline.preflight.common import Part, PreflightSettings, RegenerationStages, attempt, failed_upstream, skip_all
from draftline.runtime.atomic import atomic_file

# check names, as the report shows them
LOAD = "target loads in vLLM"
REGENERATION = "regeneration"
REFERENCE = "greedy decoding"
TOKENIZATION = "tokenization"


def first_rows(path: str | Path, n: int) -> list[dict]:
    rows = []
    for row in conversation_file.iter_rows(path):
        if len(rows) == n:
            break
        rows.append(row)
    return rows


def run_regenerate(part: Part, prompts_path: str | Path, stages: RegenerationStages, preflight: PreflightSettings) -> dict:
    """The regeneration part (after the environment part): load the target as regeneration does,
    answer the first `preflight.prompts` prompts, decode the first `preflight.rows` greedily (the
    reference), tokenize their conversations. Writes prompts.jsonl, conversations.jsonl,
    reference.json and tokenized/ into the part's folder."""
    from draftline.runtime.vllm_engine import shutdown, target_llm
    from draftline.stages import regenerate
    from draftline.stages import tokenize as tokenization

    out, settings = Path(part.out_dir), stages.regenerate
    out.mkdir(parents=True, exist_ok=True)
    names = [LOAD, REGENERATION, REFERENCE, TOKENIZATION]
    upstream = failed_upstream(part.upstream_dir, "environment")
    if upstream:
        return write_part(out, "regenerate", skip_all(names, f"the environment check failed ({'; '.join(upstream)})"))
    rows = first_rows(prompts_path, preflight.prompts)
    if not rows:
        raise ValueError(f"{prompts_path}: no training prompts to check the run with")
    conversation_file.write(out / "prompts.jsonl", rows)
    checks, measured = [], {"prompts": len(rows), "gpus_per_job": settings.ranks}
    engine: dict = {}

    def load() -> Check:
        t0 = time.monotonic()
        # stats on: evaluation's counters (read by the greedy reference below) need them; no output changes
        engine["llm"] = target_llm(part.target_dir, settings, disable_log_stats=False)
        seconds = measured["regeneration_load_seconds"] = round(time.monotonic() - t0, 1)
        return passed(LOAD, f"loaded in {seconds:.1f} s ({settings.dtype}, tensor x pipeline parallel "
                            f"{settings.tensor_parallel_size} x {settings.pipeline_parallel_size})")

    checks.append(attempt(LOAD, load, part.log_hint))
    if "llm" not in engine:
        checks += skip_all(names[1:], f"the target did not load ('{LOAD}')")
        return write_part(out, "regenerate", checks, measured)
    llm = engine.pop("llm")
    conversations = out / "conversations.jsonl"

    def answer() -> Check:
        summary = regenerate.regenerate(part.target_dir, out / "prompts.jsonl", conversations,
                                        out / "regenerate_summary.json", settings, llm=llm)
        rate = measured["regeneration_tokens_per_s"] = summary["tokens_per_second"]
        cut = summary["answers_truncated"]
        return passed(REGENERATION, (
            f"{summary['rows_out']} of {len(rows)} prompts answered, {summary['generated_tokens']:,} tokens at "
            f"{rate:,.1f} tok/s ({len(rows)} at once); {cut} of {summary['turns_generated']} answers cut at "
            f"regenerate.max_new_tokens {settings.max_new_tokens}"
        ), **{k: summary[k] for k in ("rows_out", "generated_tokens", "answers_truncated", "seconds")})

    if stages.enabled:
        checks.append(attempt(REGENERATION, answer, part.log_hint))
    else:
        conversation_file.write(conversations, rows)
        checks.append(not_run(REGENERATION, "regenerate.enabled is false: the dataset's answers are trained"))
    checks.append(attempt(REFERENCE, lambda: _greedy_reference(llm, out, preflight.rows, stages.evaluate, measured),
                           part.log_hint))
    shutdown(llm)
    llm = None  # the closure above holds it: release the engine before the next stage

    def tokenize() -> Check:
        picked = first_rows(conversations, preflight.rows)
        conversation_file.write(out / "rows.jsonl", picked)
        folder = out / "tokenized"
        summary = tokenization.tokenize(part.target_dir, out / "rows.jsonl", folder / "dataset",
                                        folder / "token_freq.pt", folder / "summary.json", stages.tokenize)
        measured["rows"] = summary["rows"]
        return passed(TOKENIZATION, f"{summary['rows']} rows, {summary['total_tokens']:,} tokens, "
                                    f"{summary['trainable_tokens']:,} trained (assistant) tokens")

    if checks[1].failed:
        checks.append(not_run(TOKENIZATION, f"'{REGENERATION}' failed"))
    else:
        checks.append(attempt(TOKENIZATION, tokenize, part.log_hint))
    return write_part(out, "regenerate", checks, measured)


def _greedy_reference(llm, out: Path, rows: int, evaluate_settings, measured: dict) -> Check:
    """The target's greedy answers to the first `rows` prompts, as evaluation decodes them
    (reference.json): what the speculative part's outputs must equal."""
    from draftline.stages import evaluate

    chat_template = Path(evaluate_settings.chat_template).read_text() if evaluate_settings.chat_template else None
    prompts = evaluate.read_prompts(out / "prompts.jsonl", rows)
    prompts, skipped = evaluate.fitting_prompts(llm.get_tokenizer(), prompts, evaluate_settings, chat_template)
    if not prompts:
        raise ValueError(f"no prompt fits max_model_len={evaluate_settings.max_model_len} with "
                         f"evaluate.max_new_tokens {evaluate_settings.max_new_tokens}")
    run = evaluate.timed_generate(llm, prompts, evaluate_settings, chat_template)
    record = {"prompts": [{"id": p.id, "messages": p.messages} for p in prompts], "token_ids": run["token_ids"],
              "skipped": skipped, "max_new_tokens": evaluate_settings.max_new_tokens}
    with atomic_file(out / "reference.json") as f:
        f.write(json.dumps(record) + "\n")
    measured["greedy_tokens_per_s"] = run["output_tokens_per_s"]
    return passed(REFERENCE, f"{len(prompts)} prompts x <= {evaluate_settings.max_new_tokens} tokens, "
                             f"{run['output_tokens']:,} tokens at {run['output_tokens_per_s']} tok/s")
