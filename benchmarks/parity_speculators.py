"""Parity with speculators' own flow (issue #27 part 2): the same rows through speculators' own
entry points, evaluated beside draftline's draft in draftline's evaluate code, paired by prompt.

    # 1. draftline's default run first (its results/ give the answers and the draft to compare)
    ./draftline snakemake --cores all results/summary.md
    # 2. speculators' side, stage by stage, on that run's training answers (OUT: /tmp/parity)
    PYTHONPATH=src .venv/bin/python benchmarks/parity_speculators.py run --out /tmp/parity
    # 3. the record: paired difference on the test prompts, stage times of both sides
    PYTHONPATH=src .venv/bin/python benchmarks/parity_speculators.py record --out /tmp/parity \
        --record benchmarks/results/parity_speculators

Stages of `run` (each timed, wall seconds, into OUT/stages.json; `--stages` picks some):
- prepare: results/regenerated/conversations.jsonl (draftline's 240 training conversations with
  the target's own answers; validation and test prompts are not in it) as `conversations` rows;
  `speculators prepare-data` tokenizes and masks them through a vLLM server's
  `/v1/chat/completions/render` and counts token frequencies (`--no-skip-token-freq`).
- hidden: `speculators generate-offline-data` against the same vLLM server started for hidden
  states (`extract_hidden_states`, the aux layers and the last one). The stock connector fails on
  CPU (pin_memory needs CUDA; /work/shared/NOTES.md), so the server loads draftline's
  `CPUHiddenStatesConnector`, the one substitution on the data side.
- hidden_from_draftline: the fallback where generate-offline-data cannot finish (on a loaded CPU
  its fixed 10 s wait for a file's lock runs out): every row of speculators' dataset gets
  draftline's hidden-state file of the row with the same token ids, or the prefix of the row it
  begins (an earlier turn of a multi-turn conversation). Files generate-offline-data did write
  are moved to OUT/spec_own_states first and compared by `record`.
- train: speculators' `train` command (`speculators.__main__.app`, `train ...`) on its own data,
  hidden states and vocabulary (built by speculators from its token_freq.pt), with the default
  config's settings (epochs, lr, total_seq_len, draft vocab, ttt steps, layers, optimizer, split,
  seed) and the CPU shims draftline's `stages.train.entry.apply_cpu_shims` applies (speculators 0.9.0's
  Trainer assumes an accelerator: plain `speculators train` stops on CPU).
- evaluate: `draftline.stages.evaluate.evaluate` on the run's test prompts with the run's settings (the
  plan of config/config.yaml), the speculators-trained last epoch as draft "trained".

`record` also compares the two flows' training inputs (token ids, loss masks, hidden states,
vocab maps) and takes draftline's stage times from results/benchmarks and its Trainer's
metrics.jsonl; its notes (--notes, markdown) say what ran and what did not.

The vLLM server is started by draftline's `backends.vllm_server` command builder (the run's engine
settings), plus `--enable-scale-out` (vLLM serves /render only with it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

STAGES = ("prepare", "hidden", "hidden_from_draftline", "train", "evaluate")


def plan():
    """draftline's plan of config/config.yaml (as rules/common.smk makes it)."""
    import yaml
    from snakemake.utils import validate

    from draftline.planning import plan as planning
    from draftline.planning import sizing
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    validate(config, schema=str(REPO / "config/schema/config.schema.yaml"))
    p = planning.plan(config, workdir=REPO, repo=REPO, executor=None, remote_exec=False,
                      gpu_overrides=sizing.gpu_overrides({}))
    return p, config


def timed(stages: dict, name: str, cmd: list[str], log: Path, env: dict | None = None) -> None:
    started = time.monotonic()
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    with log.open("w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
    stages[name] = {"command": " ".join(cmd), "seconds": round(time.monotonic() - started, 1), "rc": rc, "log": str(log),
                    "status": "done" if rc == 0 else f"failed (rc {rc})"}
    print(f"[{name}] rc {rc} in {stages[name]['seconds']} s", flush=True)
    if rc:
        raise SystemExit(f"{name} failed: see {log}")


class saved:  # noqa: N801 - a context manager: stages.json written on the way out, also after a failure
    def __init__(self, stages: dict, path: Path):
        self.stages, self.path = stages, path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.path.write_text(json.dumps(self.stages, indent=1))


class Server:
    """vLLM's OpenAI server for the target: /render (prepare-data) and hidden states (offline)."""

    def __init__(self, target: str, extracted: list[int], engine, out: Path):
        from draftline.backends.vllm_server import ServerSettings, free_port, server_command, server_env

        self.port = free_port()
        settings = ServerSettings(target_dir=target, extracted=tuple(extracted),
                                  engine=replace(engine, max_model_len=2048, threads=2), cuda=False)
        self.cmd = [*server_command(settings, self.port, out / "server_scratch"), "--enable-scale-out"]
        self.env = server_env(settings, None)
        self.log = out / "server.log"
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        print(f"[server] {' '.join(self.cmd)}", flush=True)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"vLLM server stopped: see {self.log}")
            try:
                urllib.request.urlopen(f"{self.url}/v1/models", timeout=2)
                break
            except OSError:
                time.sleep(2)
        self.start_s = round(time.monotonic() - self.started, 1)
        print(f"[server] up in {self.start_s} s", flush=True)
        return self

    def __exit__(self, *exc):
        import os
        import signal

        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def train_flags(p, config: dict, data: Path, save: Path) -> list[str]:
    """speculators' train flags: speculators' own data, states and vocabulary; the default
    config's settings (draftline.stages.train.args passes the same values)."""
    from draftline.planning.rule_params import resolve_optimizer

    t = config["train"]
    layers = json.loads((REPO / "results/target/layer_ids.json").read_text())
    return [
        "--speculator-type", "eagle3",
        "--verifier-name-or-path", str(p.target_dir),
        "--data-path", str(data),
        "--hidden-states-path", str(data / "hidden_states"),
        "--token-freq-path", str(data / "token_freq.pt"),
        "--draft-vocab-size", str(config["vocab"]["draft_vocab_size"]),
        "--target-layer-ids", *map(str, layers["aux"]),
        "--num-layers", str(config["draft"]["num_layers"]),
        "--epochs", str(t["epochs"]),
        "--lr", repr(float(t["lr"])),
        "--optimizer", resolve_optimizer(t["optimizer"], False),
        "--total-seq-len", str(t["total_seq_len"]),
        "--train-data-ratio", repr(float(t["train_fraction"])),
        "--ttt-steps", str(t["ttt_steps"]),
        "--seed", str(t["seed"]),
        # what CPU needs (/work/shared/NOTES.md; draftline passes the same)
        "--hidden-states-dtype", "float32", "--loss-implementation", "eager", "--draft-attn-impl", "sdpa",
        "--num-workers", "0", "--on-missing", "raise",
        "--save-path", str(save), "--log-dir", str(save / "logs"),
    ]


SHIM = """
import sys
from draftline.stages.train.entry import apply_cpu_shims
apply_cpu_shims()
from speculators.__main__ import app
sys.argv = ["speculators", "train", *sys.argv[1:]]
app()
"""


def run(args) -> None:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    p, config = plan()
    target = str((REPO / p.target_dir).resolve())
    layers = json.loads((REPO / "results/target/layer_ids.json").read_text())
    stages_path = out / "stages.json"
    stages = json.loads(stages_path.read_text()) if stages_path.exists() else {}
    data = out / "data"
    py = sys.executable
    spec = [str(Path(py).parent / "speculators")]
    want = args.stages.split(",") if args.stages else STAGES

    if "prepare" in want or "hidden" in want:
        conv = out / "conversations.jsonl"
        with conv.open("w") as f:
            for line in (REPO / "results/regenerated/conversations.jsonl").read_text().splitlines():
                row = json.loads(line)
                f.write(json.dumps({"id": row.get("id"), "conversations": row["messages"]}) + "\n")
        with Server(target, layers["extracted"], p.engine, out) as server, saved(stages, stages_path):
            stages["server_start"] = {"command": " ".join(server.cmd), "seconds": server.start_s, "rc": 0}
            if "prepare" in want:
                timed(stages, "prepare", [*spec, "prepare-data", "--model", target, "--data", str(conv),
                                          "--output", str(data), "--seq-length", str(config["tokenize"]["max_seq_len"]),
                                          "--render-endpoint", server.url, "--seed", "0", "--no-skip-token-freq",
                                          "--num-preprocessing-workers", "2", "--overwrite"],
                      out / "prepare.log")
            if "hidden" in want:
                timed(stages, "hidden", [*spec, "generate-offline-data", "--model", target, "--endpoint",
                                         f"{server.url}/v1", "--preprocessed-data", str(data),
                                         "--concurrency", "2", "--validate-outputs", "--fail-on-error"],
                      out / "hidden.log")
        stages_path.write_text(json.dumps(stages, indent=1))

    if "hidden_from_draftline" in want:
        # speculators' generate-offline-data could not finish here (see the record): each of its
        # rows gets draftline's states of the row with the same token ids, or the prefix of the
        # row it begins (an earlier turn of a multi-turn conversation; causal: same states)
        started = time.monotonic()
        stages["hidden_from_draftline"] = {**map_draftline_states(data, REPO / "results/tokenized/dataset",
                                                                  REPO / "results/hidden_states/all"),
                                           "seconds": None}
        stages["hidden_from_draftline"]["seconds"] = round(time.monotonic() - started, 1)
        stages_path.write_text(json.dumps(stages, indent=1))

    if "train" in want:
        import os

        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        timed(stages, "train", [py, "-c", SHIM, *train_flags(p, config, data, out / "spec_ckpt")], out / "train.log", env)
        stages_path.write_text(json.dumps(stages, indent=1))

    if "evaluate" in want:
        from draftline.stages.evaluate import EvaluateSettings, evaluate

        epochs = sorted((d for d in (out / "spec_ckpt").iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
        e = config["evaluate"]
        settings = p.engine.stage(EvaluateSettings, num_speculative_tokens=e["num_speculative_tokens"],
                                  max_new_tokens=e["max_new_tokens"], max_prompts=e["max_prompts"], seed=e["seed"],
                                  chat_template=config["target"]["chat_template"],
                                  chat_template_kwargs=config["target"]["chat_template_kwargs"], threads=1)
        started = time.monotonic()
        evaluate(target, {"test": str(REPO / "results/prompts/test.jsonl")}, {"trained": str(epochs[-1])},
                 out / "acceptance.json", settings)
        stages["evaluate"] = {"command": f"draftline.stages.evaluate.evaluate(test set, draft {epochs[-1]})",
                              "seconds": round(time.monotonic() - started, 1), "rc": 0}
        stages_path.write_text(json.dumps(stages, indent=1))


def map_draftline_states(data: Path, dl_dataset: Path, dl_states: Path) -> dict:
    """hs_{i}.safetensors in data/hidden_states for every row i of speculators' dataset, from
    draftline's file of the row with identical token ids (or the row it is a prefix of)."""
    import shutil

    import torch
    from datasets import load_from_disk
    from safetensors.torch import load_file, save_file

    out = data / "hidden_states"
    if out.exists():  # what generate-offline-data wrote: kept apart for `record` to compare
        own = data.parent / "spec_own_states"
        own.mkdir(exist_ok=True)
        for f in out.glob("hs_*.safetensors"):
            f.rename(own / f.name)
        shutil.rmtree(out)
    out.mkdir(parents=True)
    dl = load_from_disk(str(dl_dataset)).with_format("python")
    by_ids = {tuple(r["input_ids"]): j for j, r in enumerate(dl)}
    dl_ids = [tuple(r["input_ids"]) for r in dl]
    sp = load_from_disk(str(data)).with_format("python")
    exact = prefix = 0
    for i, row in enumerate(sp):
        ids = tuple(row["input_ids"])
        j = by_ids.get(ids)
        if j is None:
            j = next(k for k, other in enumerate(dl_ids) if other[: len(ids)] == ids)
            prefix += 1
        else:
            exact += 1
        states = load_file(str(dl_states / f"hs_{j}.safetensors"))
        n = len(ids)
        assert torch.equal(states["token_ids"][:n], torch.tensor(ids, dtype=states["token_ids"].dtype))
        save_file({k: v[:n].contiguous() for k, v in states.items()}, str(out / f"hs_{i}.safetensors"))
    return {"rows": len(sp), "identical_rows": exact, "prefix_rows": prefix}


# ---------------------------------------------------------------- the record


def dataset_tokens(path: Path) -> dict:
    """Rows, tokens and supervised (loss-mask) tokens of a speculators arrow dataset."""
    from datasets import load_from_disk

    ds = load_from_disk(str(path)).with_format("python")
    return {"rows": len(ds), "tokens": sum(ds["seq_len"]), "supervised_tokens": sum(sum(m) for m in ds["loss_mask"])}


def mask_differences(dl_dataset: Path, data: Path, target: str) -> dict:
    """Rows of speculators' dataset whose token ids equal a draftline row, and for those the
    tokens whose loss mask differs: (token, draftline mask, speculators mask) -> rows."""
    from collections import Counter

    from datasets import load_from_disk
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    dl = {tuple(r["input_ids"]): r["loss_mask"] for r in load_from_disk(str(dl_dataset)).with_format("python")}
    kinds, matched, other = Counter(), 0, []
    for r in load_from_disk(str(data)).with_format("python"):
        ids = tuple(r["input_ids"])
        if ids not in dl:
            other.append(sum(r["loss_mask"]))
            continue
        matched += 1
        diff = sorted({(tok.decode([ids[i]]), dl[ids][i], r["loss_mask"][i])
                       for i, (a, b) in enumerate(zip(dl[ids], r["loss_mask"])) if a != b})
        kinds[json.dumps(diff) if len(diff) <= 2 else "many tokens (a multi-turn conversation's last row)"] += 1
    return {"identical_token_rows": matched, "rows_without_identical_draftline_row": len(other),
            "their_supervised_tokens": sum(other), "mask_differences_rows": dict(kinds.most_common())}


def states_check(own: Path, mapped: Path) -> dict | None:
    """speculators' own generate-offline-data files against draftline's for the same rows."""
    import torch
    from safetensors.torch import load_file

    files = sorted(own.glob("hs_*.safetensors"))
    if not files:
        return None
    worst, relative, tokens, identical = 0.0, 0.0, 0, 0
    for f in files:
        a, b = load_file(str(f)), load_file(str(mapped / f.name))
        assert torch.equal(a["token_ids"], b["token_ids"]), f
        diff = (a["hidden_states"] - b["hidden_states"]).abs()
        identical += int(diff.max().item() == 0)
        worst = max(worst, diff.max().item())
        # per token and layer: |difference| over the state's own largest magnitude
        relative = max(relative, (diff.amax(-1) / a["hidden_states"].abs().amax(-1).clamp_min(1e-12)).max().item())
        tokens += len(a["token_ids"])
    return {"rows": len(files), "tokens": tokens, "token_ids_identical": True, "identical_rows": identical,
            "max_abs_difference": worst, "max_relative_difference": relative}


def vocab_check(data: Path) -> dict:
    import numpy as np

    d2t = np.array_equal(np.load(REPO / "results/vocab/d2t.npy"), np.load(data / "d2t-8192.npy"))
    t2d = np.array_equal(np.load(REPO / "results/vocab/t2d.npy"), np.load(data / "t2d-8192.npy"))
    return {"d2t_identical": d2t, "t2d_identical": t2d}


def steps_from_log(log: Path) -> list[dict]:
    """The per-step records speculators printed (its console logger): step time, tokens/s, loss."""
    import re

    text = re.sub(r"\s+", " ", log.read_text(errors="replace"))
    rows = []
    for m in re.finditer(r"train/loss=([\d.]+).*?profile/step_ms=([\d.e+]+).*?profile/tokens_per_s=([\d.]+).*?global_step=(\d+)", text):
        rows.append({"step": int(m[4]), "loss": float(m[1]), "step_s": round(float(m[2]) / 1000, 1), "tokens_per_s": float(m[3])})
    return rows


def steps_from_metrics(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "profile" in r and "train" in r:
            rows.append({"step": r["global_step"], "loss": round(r["train"]["loss"], 3),
                         "step_s": round(r["profile"]["step_ms"] / 1000, 1), "tokens_per_s": round(r["profile"]["tokens_per_s"], 1)})
    return rows


def record(args) -> None:
    from record_run import header, header_line, load, stage_times, write_record

    from draftline.artifacts.acceptance import compare_files

    out = Path(args.out)
    p, config = plan()
    target = str((REPO / p.target_dir).resolve())
    stages = json.loads((out / "stages.json").read_text())
    sec = {row.job: round(float(row.seconds), 1) for row in stage_times(REPO).itertuples()}
    dl_data = dataset_tokens(REPO / "results/tokenized/dataset")
    sp_data = dataset_tokens(out / "data")
    run_dir = next((REPO / "results/checkpoint/runs").iterdir())
    dl_steps, sp_steps = steps_from_metrics(run_dir / "metrics.jsonl"), steps_from_log(out / "train.log")
    shards = {k: v for k, v in sec.items() if k.startswith("hidden_states/shard")}

    def rate(tokens, seconds):
        return round(tokens / seconds, 1) if tokens and seconds else None

    def training(steps, seconds, finished):
        median = sorted(r["step_s"] for r in steps)[len(steps) // 2] if steps else None
        return (seconds, round(sum(r["tokens_per_s"] for r in steps) / len(steps), 1) if steps else None,
                f"{'done' if finished else 'stopped'}: {len(steps)} steps logged (median step {median} s)")

    sp_train, sp_eval = stages.get("train", {}), stages.get("evaluate")
    rows = [
        ("draftline", "tokenize (loss masks, token freq; speculators' preprocessing writes the dataset)", sec.get("tokenize"),
         rate(dl_data["tokens"], sec.get("tokenize")), "done"),
        ("draftline", "hidden states (2 shards at once; wall of the longer, vLLM engine start included)", max(shards.values()),
         rate(dl_data["tokens"], max(shards.values())), "done"),
        ("draftline", "train (speculators' Trainer, draftline.stages.train.entry)",
         *training(dl_steps, sec.get("train"), (REPO / "results/checkpoint/final").is_dir())),
        ("draftline", "evaluate (every set, trained and untrained drafts, target alone)", sec.get("evaluate"), None,
         "done" if sec.get("evaluate") else "not run"),
        ("speculators", "vLLM server start (for /render and hidden states)", stages["server_start"]["seconds"], None, "done"),
        ("speculators", "prepare-data (render via vLLM, masks, token freq)", stages["prepare"]["seconds"],
         rate(sp_data["tokens"], stages["prepare"]["seconds"]), "done"),
        ("speculators", "generate-offline-data (--concurrency 2; server already up)", stages.get("hidden", {}).get("seconds"),
         rate(sp_data["tokens"], stages.get("hidden", {}).get("seconds")) if stages.get("hidden", {}).get("rc") == 0 else None,
         stages.get("hidden", {}).get("status", "not run")),
        ("speculators", "train (speculators train, CPU shims)",
         *training(sp_steps, sp_train.get("seconds"), sp_train.get("status") == "done")),
        ("speculators", "evaluate (draftline.stages.evaluate, test set, trained draft only)",
         sp_eval["seconds"] if sp_eval else None, None, "done" if sp_eval else "not run"),
    ]
    dl_acc, sp_acc = REPO / "results/eval/acceptance.json", out / "acceptance.json"
    comparison = compare_files(dl_acc, sp_acc, "test") if dl_acc.exists() and sp_acc.exists() else None
    rec = {
        **header(args.command, packages=("vllm", "speculators", "torch", "transformers", "snakemake")),
        "partial": comparison is None,
        "draftline_minus_speculators_test": comparison,
        "repeats": "one pass of each stage; no spread for wall times",
        "load_during": load(Path(args.loadavg), args.start, args.end or time.time()) if args.loadavg else None,
        "stages": [dict(zip(("side", "stage", "seconds", "tokens_per_s", "status"), r)) for r in rows],
        "train_steps": {"draftline": dl_steps, "speculators": sp_steps},
        "data": {"draftline": dl_data, "speculators": sp_data},
        "masks": mask_differences(REPO / "results/tokenized/dataset", out / "data", target),
        "hidden_states_check": states_check(out / "spec_own_states", out / "data/hidden_states"),
        "hidden_states_mapping": stages.get("hidden_from_draftline"),
        "vocab": vocab_check(out / "data"),
        "rerun_after_lr_change": args.rerun,
        "commands": {k: v.get("command") for k, v in stages.items()},
        "failures": stages.get("failures", {}),
    }
    page = markdown(rec, header_line(rec), Path(args.notes).read_text() if args.notes else "")
    write_record(args.record, rec, page)
    print(page)


def markdown(rec: dict, header: str, notes: str) -> str:
    c = rec["draftline_minus_speculators_test"]
    lines = ["# Parity with speculators' own flow" + (" (PARTIAL: no acceptance comparison)" if rec["partial"] else ""), ""]
    if c:
        lines += [f"**draftline − speculators flow, test set, paired: {c['mean_acceptance_length']:+.3f} {c['bootstrap_95']}**", ""]
    lines += ["| side | stage | wall s | tokens/s | status |", "|---|---|---|---|---|"]
    for r in rec["stages"]:
        lines.append(f"| {r['side']} | {r['stage']} | {r['seconds'] if r['seconds'] is not None else '-'} | "
                     f"{r['tokens_per_s'] if r['tokens_per_s'] is not None else '-'} | {r['status']} |")
    d = rec["data"]
    lines += ["", f"Repeats: {rec['repeats']}. Training tokens/s: the mean of the steps' own figures.", "",
              f"Data: draftline {d['draftline']}; speculators {d['speculators']}.", ""]
    if rec.get("load_during"):
        lines += [f"1-minute load while this ran: {rec['load_during']}.", ""]
    m, h, v = rec["masks"], rec["hidden_states_check"], rec["vocab"]
    if not h:
        states = "hidden states not compared"
    elif h["max_abs_difference"] == 0:
        states = f"hidden states bit-identical ({h['rows']} rows compared)"
    else:
        states = (f"hidden states bit-identical in {h['identical_rows']} of {h['rows']} rows, the rest within "
                  f"{h['max_abs_difference']:.2g} absolute ({h['max_relative_difference']:.1e} of the state's largest value)")
    lines += [f"**Inputs of training: token ids identical in all {m['identical_token_rows']} of draftline's rows; "
              f"{states}; vocab maps "
              f"{'identical' if v['d2t_identical'] and v['t2d_identical'] else 'different'}; loss masks: "
              f"{d['speculators']['supervised_tokens'] - d['draftline']['supervised_tokens']:+d} supervised tokens "
              f"on speculators' side (the notes say where).**", "", header, "", notes.strip()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", default="/tmp/parity")
    r.add_argument("--stages", help=f"comma-separated, of {','.join(STAGES)} (default: all)")
    c = sub.add_parser("record")
    c.add_argument("--out", default="/tmp/parity")
    c.add_argument("--record", default="benchmarks/results/parity_speculators")
    c.add_argument("--loadavg", help="load log (lines 'ISO-time load1 load5 load15 ...')")
    c.add_argument("--start", type=float, default=0.0, help="epoch seconds the load window starts")
    c.add_argument("--end", type=float, default=0.0, help="epoch seconds the load window ends (default: now)")
    c.add_argument("--notes", help="a markdown file of findings, appended to the page")
    c.add_argument("--rerun", type=json.loads, default=None, help="JSON: what a train.lr change plans (draftline dry run)")
    c.add_argument("--command", default="see the record's commands", help="the command line to record")
    args = parser.parse_args()
    (run if args.what == "run" else record)(args)


if __name__ == "__main__":
    main()
