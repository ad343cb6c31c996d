"""The speculative part (one engine, after the regeneration part): an untrained draft of the
run's speculator config (evaluation's `make_untrained_draft`, vocab maps by the vocab stage's
own code from the tokenized rows' frequencies) served in vLLM's speculative decoding; its greedy
outputs must equal the target's own (reference.json) token for token."""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftline.artifacts.preflight import Check, not_run, passed, read_part, write_part
from draftline.preflight.common import Part, attempt, skip_all
from draftline.preflight.regeneration import REFERENCE, TOKENIZATION

# check names, as the report shows them
DRAFT = "untrained draft"
LOSSLESS = "speculative decoding is lossless"


def run_speculative(
    part: Part, config_dir: str | Path, evaluate_settings, *, draft_vocab_size: int, trust_remote_code: bool = False,
) -> dict:
    """The speculative part (after the regeneration part): an untrained draft of the run's config
    (vocab maps from the tokenized rows' frequencies), served in vLLM; its greedy outputs must
    equal the reference."""
    from draftline.runtime.vllm_engine import shutdown
    from draftline.stages import evaluate, vocab

    target_dir, regenerate_dir, log_hint = part.target_dir, part.upstream_dir, part.log_hint
    out = Path(part.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    statuses = {c.name: c.status for c in read_part(regenerate_dir)["checks"]}
    missing = [n for n in (REFERENCE, TOKENIZATION) if statuses.get(n) != "pass"]
    if missing:
        why = f"regenerate: {', '.join(missing)} did not pass"
        return write_part(out, "speculative", skip_all([DRAFT, LOSSLESS], why))
    reference = json.loads((Path(regenerate_dir) / "reference.json").read_text())
    draft = out / "untrained_draft"
    measured: dict = {}

    def build() -> Check:
        tokenized = Path(regenerate_dir) / "tokenized"
        vocab.write_vocab(tokenized / "token_freq.pt", target_dir, draft_vocab_size, out / "d2t.npy", out / "t2d.npy",
                          out / "vocab_summary.json", trust_remote_code)
        evaluate.make_untrained_draft(config_dir, out / "d2t.npy", out / "t2d.npy", draft, target=target_dir,
                                      seed=evaluate_settings.seed)
        config = json.loads((draft / "config.json").read_text())
        return passed(DRAFT, f"{config['speculators_model_type']} draft of {config_dir} (draft vocab "
                             f"{config['draft_vocab_size']:,}), fresh weights, tensors checked")

    checks = [attempt(DRAFT, build, log_hint)]
    if checks[0].failed:
        checks.append(not_run(LOSSLESS, f"'{DRAFT}' failed"))
        return write_part(out, "speculative", checks, measured)

    def decode() -> Check:
        chat_template = Path(evaluate_settings.chat_template).read_text() if evaluate_settings.chat_template else None
        prompts = [evaluate.Prompt(p["id"], p["messages"]) for p in reference["prompts"]]
        t0 = time.monotonic()
        llm = evaluate.engine_for(target_dir, evaluate_settings, draft=draft)
        measured["speculative_load_seconds"] = round(time.monotonic() - t0, 1)
        try:
            run = evaluate.timed_generate(llm, prompts, evaluate_settings, chat_template)
            lossless = evaluate.check_lossless(prompts, reference["token_ids"], run["token_ids"], "untrained",
                                               llm.get_tokenizer(), tolerance=evaluate_settings.lossless_tolerance)
        finally:
            shutdown(llm)
        numbers = evaluate.acceptance(run["counters"], evaluate_settings.num_speculative_tokens)
        measured["speculative_tokens_per_s"] = run["output_tokens_per_s"]
        return passed(LOSSLESS, (
            f"{len(prompts)} prompts, {run['output_tokens']:,} tokens: {lossless['identical']} of them equal to the target's "
            f"own greedy outputs token for token (evaluate.lossless_tolerance {lossless['tolerance']}); mean acceptance "
            f"length {numbers['mean_acceptance_length']:.2f} with k="
            f"{evaluate_settings.num_speculative_tokens} (an untrained draft: about 1)"
        ), mean_acceptance_length=round(numbers["mean_acceptance_length"], 4))

    checks.append(attempt(LOSSLESS, decode, log_hint))
    return write_part(out, "speculative", checks, measured)
