"""FP8 against full-precision hidden states: two finished runs of the same data and settings that
differ only in `hidden_states.format`, compared on disk, speed, training and acceptance.

    python benchmarks/fp8_hidden_states.py FULL_RUN FP8_RUN --out benchmarks/results/NAME \
        [--loadavg FULL_LOG FP8_LOG] [--command "CMD"] [--parity-only]

For each run: bytes per token on disk (the shards' manifests), extraction tokens/s (per shard
job, as its manifest records it, and the stage's wall time), training tokens/s and validation
loss per epoch (results/checkpoint/final/draftline_provenance.json), mean acceptance length per
prompt set with its 95% bootstrap interval (results/eval/acceptance.json), the commit and
versions (the training provenance) and the 1-minute load while its jobs ran. Beside them the
parity of the two runs' hidden states: per extracted layer, ||fp8 - full|| / ||full|| over every
token, with the fp8 states as speculators' Trainer reads them (FP8Transfer, dequantized to
bfloat16). `--parity-only` compares two runs' views without training or evaluation (e.g. the tiny
model's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_run import header, header_line, load, stage_times, write_record  # noqa: E402

from draftline.artifacts.hidden_states import file_name, manifest_format, read_manifest, read_states  # noqa: E402


def parity(full_view: Path, fp8_view: Path) -> dict:
    """Per-layer relative error of the fp8 states against the full ones, over every row's tokens."""
    import torch

    rows = read_manifest(full_view)["rows"]
    err = ref = None
    tokens = 0
    for row in range(rows):
        full = read_states(full_view / file_name(row))
        fp8 = read_states(fp8_view / file_name(row), "fp8")
        e = ((fp8 - full) ** 2).sum(dim=(0, 2))
        r = (full**2).sum(dim=(0, 2))
        err, ref = (e, r) if err is None else (err + e, ref + r)
        tokens += full.shape[0]
    per_layer = torch.sqrt(err / ref).tolist()
    layers = read_manifest(full_view)["layer_ids"]
    return {"rows": rows, "tokens": tokens, "layer_ids": layers,
            "relative_error_per_layer": [round(x, 5) for x in per_layer]}


def run_figures(workdir: Path, loadavg: Path | None) -> dict:
    results = workdir / "results"
    shards = sorted((results / "hidden_states").glob("shard_*"), key=lambda p: int(p.name.split("_")[1]))
    manifests = [read_manifest(s) for s in shards]
    tokens = sum(m["tokens"] for m in manifests)
    out = {
        "format": manifest_format(manifests[0]),
        "dtype": manifests[0]["dtype"],
        "tokens": tokens,
        "rows": sum(m["num_rows"] for m in manifests),
        "bytes": sum(m["bytes"] for m in manifests),
        "bytes_per_token": round(sum(m["bytes"] for m in manifests) / tokens, 1),
        "extraction": [{k: m[k] for k in ("shard", "tokens", "load_seconds", "extract_seconds", "tokens_per_s")}
                       for m in manifests],
    }
    times = stage_times(workdir)
    own = {row.job: round(row.seconds, 1) for row in times.itertuples()}
    out["stage_seconds"] = {k: v for k, v in own.items() if k.startswith(("hidden_states", "train", "evaluate"))}
    hs_rows = times[times["job"].str.startswith("hidden_states/shard")]
    if len(hs_rows):
        span = float(hs_rows["end"].max() - hs_rows["start"].min())
        out["extraction_wall_s"] = round(span, 1)
        out["extraction_tokens_per_s_wall"] = round(tokens / span, 1)  # shards side by side, load included
    out["load_during_run"] = load(loadavg, float(times["start"].min()), float(times["end"].max()))
    final = results / "checkpoint" / "final"
    if not (final / "draftline_provenance.json").is_file():  # training not finished yet
        out["training"] = out["acceptance"] = None
        return out
    chosen = json.loads((final / "draftline_provenance.json").read_text())
    train = json.loads((final / "provenance.json").read_text())
    out["workflow"] = train.get("workflow")
    out["versions"] = train.get("versions")
    out["training"] = {"throughput": chosen.get("throughput"), "val_loss_per_epoch": chosen.get("val_loss_per_epoch"),
                       "chosen_epoch": chosen.get("chosen_epoch"),
                       "hidden_states_format": chosen.get("hidden_states_format", "full")}
    if not (results / "eval" / "acceptance.json").is_file():  # evaluation not finished yet
        out["acceptance"] = None
        return out
    acceptance = json.loads((results / "eval" / "acceptance.json").read_text())
    out["acceptance"] = {
        name: {draft: {"mean_acceptance_length": round(d["mean_acceptance_length"], 4),
                       "bootstrap_95": (d.get("spread") or {}).get("bootstrap_95"),
                       "acceptance_per_position": [round(x, 4) for x in d["acceptance_per_position"]]}
               for draft, d in data["drafts"].items()} | {"prompts": data["prompts"]}
        for name, data in acceptance["sets"].items()
    }
    out["lossless"] = acceptance.get("lossless")
    return out


def markdown(record: dict) -> str:
    full, fp8 = record["runs"]["full"], record["runs"]["fp8"]
    lines = ["| | full | fp8 |", "|---|---|---|"]

    def row(label, f):
        def cell(r):
            try:
                return f(r)
            except (KeyError, TypeError):
                return "not finished"
        lines.append(f"| {label} | {cell(full)} | {cell(fp8)} |")

    row("stored as", lambda r: r["dtype"] if r["format"] == "full" else "float8_e4m3fn + fp32 scale/token")
    row("bytes per token on disk", lambda r: f"{r['bytes_per_token']:,}")
    row("hidden states on disk", lambda r: f"{r['bytes'] / 1e6:.1f} MB ({r['tokens']:,} tokens, {r['rows']} files)")
    row("extraction tok/s per shard (manifest)", lambda r: " / ".join(str(e["tokens_per_s"]) for e in r["extraction"]))
    row("extraction wall (2 shards side by side)", lambda r: f"{r.get('extraction_wall_s')} s "
        f"({r.get('extraction_tokens_per_s_wall')} tok/s)")
    row("training tok/s (median step)", lambda r: f"{r['training']['throughput']['tokens_per_s']} "
        f"({r['training']['throughput'].get('median_step_tokens_per_s')})")
    row("validation loss per epoch", lambda r: " / ".join(f"{v:.3f}" for v in r["training"]["val_loss_per_epoch"].values()))
    for name in (full["acceptance"] or fp8["acceptance"] or {"test": 0, "validation": 0}):
        row(f"{name}: mean acceptance length, trained [95% bootstrap]",
            lambda r, n=name: f"{r['acceptance'][n]['trained']['mean_acceptance_length']:.3f} "
            f"{r['acceptance'][n]['trained']['bootstrap_95']}, {r['acceptance'][n]['prompts']} prompts")
        row(f"{name}: untrained", lambda r, n=name: f"{r['acceptance'][n]['untrained']['mean_acceptance_length']:.3f}")
    row("lossless (outputs identical to the target's)", lambda r: r["lossless"])
    row("1-minute load while its jobs ran (min-median-max)", lambda r: (
        f"{r['load_during_run']['load1_min']}-{r['load_during_run']['load1_median']}-{r['load_during_run']['load1_max']}"
        if r["load_during_run"] else "-"))
    row("commit", lambda r: (r.get("workflow") or {}).get("commit", "?")[:10])
    par = record["parity"]
    lines += ["", f"Parity (fp8 as speculators' Trainer reads it vs full, {par['tokens']:,} tokens, {par['rows']} rows): "
              "relative error per extracted layer " + ", ".join(
                  f"{lid}: {e:.4f}" for lid, e in zip(par["layer_ids"], par["relative_error_per_layer"]))]
    lines += ["", header_line(record)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("full", type=Path)
    parser.add_argument("fp8", type=Path)
    parser.add_argument("--out", required=True)
    parser.add_argument("--loadavg", type=Path, nargs=2)
    parser.add_argument("--command", default="")
    parser.add_argument("--parity-only", action="store_true")
    args = parser.parse_args()
    par = parity(args.full / "results/hidden_states/all", args.fp8 / "results/hidden_states/all")
    if args.parity_only:
        print(json.dumps(par, indent=1))
        return
    logs = args.loadavg or (None, None)
    record = {
        **header(args.command, packages=("torch", "speculators", "hs-connectors"), commit_paths=("src", "benchmarks")),
        "runs": {"full": run_figures(args.full, logs[0]), "fp8": run_figures(args.fp8, logs[1])},
        "parity": par,
    }
    out = Path(args.out)
    text = markdown(record)
    notes = out.with_name(out.name + "_notes.md")  # how the runs were made, written by hand
    write_record(out, record, text + ("\n" + notes.read_text() if notes.is_file() else ""))
    print(text)


if __name__ == "__main__":
    main()
