"""The hidden-state part (one engine, after the regeneration part): its tokenized rows through
the extraction stage's own code (`hidden_states.extract_shard`: the configured backend,
connector, layers, format and parallel split, every file validated), then the hidden-state
fidelity check (`fidelity_check`) on the files."""

from __future__ import annotations

from pathlib import Path

from draftline.artifacts.preflight import Check, failed, not_run, passed, read_part, write_part
from draftline.fidelity import FidelitySettings
from draftline.preflight.common import Part, attempt, failed_upstream, skip_all
from draftline.preflight.regeneration import TOKENIZATION
from draftline.runtime.shards import ShardJob
from draftline.settings import DEFAULTS, HiddenStateFormat

# check names, as the report shows them
EXTRACTION = "hidden-state extraction"
FIDELITY = "hidden-state fidelity"


def fidelity_check(target_dir: str | Path, samples: list[tuple], extracted: list[int], min_top1: float, where: str,
                   trust_remote_code: bool = False) -> Check:
    """The hidden-state fidelity check on the extracted rows (draftline.fidelity, the same check
    every extraction shard passes): the one place the preflight calls it. `samples` are (row,
    hidden_states [seq, n_layers, hidden] float, token_ids, loss_mask)."""
    from draftline import fidelity

    head = fidelity.read_head(target_dir, trust_remote_code)
    measured = fidelity.measure(head, samples, extracted)
    details = {k: measured.get(k) for k in ("top1_assistant", "top1_all", "assistant_tokens")}
    try:
        fidelity.check(measured, min_top1, where)
    except fidelity.FidelityError as error:
        return failed(FIDELITY, str(error), **details)
    return passed(FIDELITY, (
        f"the target's own head on the stored last layer predicts the next token on {measured['top1_assistant']} of "
        f"{measured['assistant_tokens']} assistant positions (bar {min_top1}); every stored layer distinct"
    ), **details)


def run_hidden_states(
    part: Part, layer_ids_path: str | Path, engine, *, backend: str = "vllm", format: HiddenStateFormat = DEFAULTS.hidden_states.format,
    fidelity_min_top1: float = 0.9,
) -> dict:
    """The hidden-state part (after the regeneration part): its tokenized rows through the
    extraction stage (one shard of them), then the fidelity check on its files."""
    from draftline.artifacts import layer_ids as layer_ids_file
    from draftline.artifacts.hidden_states import file_name, read_states
    from draftline.stages import hidden_states

    target_dir, regenerate_dir, log_hint = part.target_dir, part.upstream_dir, part.log_hint
    out = Path(part.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    upstream = failed_upstream(regenerate_dir, "regenerate")
    record = read_part(regenerate_dir)
    tokenized = {c.name: c.status for c in record["checks"]}.get(TOKENIZATION)
    if tokenized != "pass":
        why = f"no tokenized rows ({'; '.join(upstream) or f'regenerate: {TOKENIZATION} {tokenized}'})"
        return write_part(out, "hidden_states", skip_all([EXTRACTION, FIDELITY], why))
    dataset = Path(regenerate_dir) / "tokenized" / "dataset"
    shard = out / "shard"
    measured: dict = {}
    result: dict = {}

    def extract() -> Check:
        manifest = result["manifest"] = hidden_states.extract_shard(
            dataset, target_dir, layer_ids_path, ShardJob(0, 1, shard, staging_root=out / ".staging"), engine,
            hidden_states.ExtractionSettings(
                backend=backend, format=format,
                fidelity=FidelitySettings(rows=0),  # checked once, below, as its own check with the run's bar
            ),
        )
        measured["extraction_load_seconds"] = manifest["load_seconds"]
        rate = measured["extraction_tokens_per_s"] = manifest["tokens_per_s"]
        return passed(EXTRACTION, (
            f"{manifest['num_rows']} rows, {manifest['tokens']:,} tokens, layers {manifest['layer_ids']['extracted']} "
            f"({backend}, {format}, {manifest['dtype']}), every file validated; engine ready in "
            f"{manifest['load_seconds']} s, {rate} tok/s"
        ), bytes=manifest["bytes"])

    checks = [attempt(EXTRACTION, extract, log_hint)]
    if "manifest" not in result:
        checks.append(not_run(FIDELITY, f"'{EXTRACTION}' failed"))
        return write_part(out, "hidden_states", checks, measured)

    def fidelity() -> Check:
        from datasets import load_from_disk

        rows = load_from_disk(str(dataset)).with_format(None)
        extracted = layer_ids_file.read(layer_ids_path).extracted
        samples = [(i, read_states(shard / file_name(i), format), row["input_ids"], row["loss_mask"])
                   for i, row in enumerate(rows)]
        return fidelity_check(target_dir, samples, extracted, fidelity_min_top1, f"preflight extraction ({shard})",
                              engine.trust_remote_code)

    checks.append(attempt(FIDELITY, fidelity, log_hint))
    return write_part(out, "hidden_states", checks, measured)
