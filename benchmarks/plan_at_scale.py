"""The plan at scale (issue 15 section 4): 100,000 prompts, 256 regeneration shards, 1,024
hidden-state shards.

Two parts, each on the tiny target (used in place; no vLLM runs):

- plan: `snakemake -n results/lineage.json` from scratch (no results/, no .snakemake/) and on a
  finished run ("Nothing to be done": every output faked, then `--touch` records Snakemake's
  metadata in job order), each repeated, with wall and CPU seconds (CPU seconds are what the dry
  run costs on an idle core, whatever else runs here) and the 1-minute load when each run started;
- memory: the CPU steps that read whole files, each in a fresh process reporting its peak RSS
  (VmHWM): prompts (`build_prompts` on the 100,000 prompts), regenerate_merge (`merge_shards`
  over 256 shard folders of synthetic answers, `regenerated_shards`), tokenize (`tokenize` on
  100,000 synthetic conversations with the tiny target's tokenizer), and the interpreter with
  tokenize's imports alone (the floor under tokenize). `--old-src DIR` measures tokenize with
  another checkout's src/ too (the code before it was streamed).

    PYTHONPATH=src:tests .venv/bin/python benchmarks/plan_at_scale.py --repeats 5

Writes benchmarks/results/plan_at_scale.{json,md} (after each part, so a partial run keeps
what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from record_run import header, header_line, this_command, write_record  # noqa: E402
from workflow import REPO, SNAKEMAKE, fake_finished_run, planned_jobs, snakemake, write_config  # noqa: E402

from draftline.testing.tiny_model import build_tiny_model  # noqa: E402

TARGET = "results/lineage.json"

STEP = r'''
import json, sys, threading, time
from pathlib import Path
step, root, model = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

def status_kb(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))

# anonymous memory (heap, not the pages of memory-mapped files, which VmHWM also counts), sampled
peak_anon = [status_kb("RssAnon")]
def sample():
    while True:
        peak_anon[0] = max(peak_anon[0], status_kb("RssAnon"))
        time.sleep(0.05)
threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
if step == "prompts":
    from draftline.stages.prompts import PromptFiles, PromptsSettings, build_prompts
    out = root / "prompts-out"
    files = PromptFiles(*(out / f"{name}.{ext}" for name, ext in (("prompts", "jsonl"), ("validation", "jsonl"),
                                                                  ("test", "jsonl"), ("rejects", "jsonl"), ("summary", "json"))))
    summary = build_prompts([str(root / "plan" / "prompts.jsonl")], files, PromptsSettings(validation=50, test=50))
    note = {"train": summary["train"]}
elif step == "merge":
    from draftline.stages.regenerate import merge_shards
    merge_shards([root / "regen" / f"shard_{k}" for k in range(int(sys.argv[4]))], root / "regen" / "settings.json",
                 root / "regen" / "conversations.jsonl", root / "regen" / "summary.json")
    note = {}
elif step.startswith("tokenize") and step != "tokenize_imports":
    from draftline.stages.tokenize import TokenizeSettings, tokenize
    out = root / step
    size = step.split(":")[1] if ":" in step else ""
    source = root / (f"tokenize_input_{size}.jsonl" if size else "tokenize_input.jsonl")
    summary = tokenize(model, source, out / "dataset", out / "token_freq.pt",
                       out / "summary.json", TokenizeSettings(max_seq_len=1024))
    note = {k: summary[k] for k in ("rows", "total_tokens", "trainable_tokens", "rows_truncated")}
elif step == "tokenize_imports":
    from speculators.data_generation.preprocessing import build_speculator_training_dataset
    from speculators.train.vocab_mapping import save_token_frequency_distribution
    from datasets import Dataset
    import draftline.stages.tokenize
    from draftline.stages.tokenize import load_tokenizer
    load_tokenizer(model)
    note = {}
wall = time.perf_counter() - t0
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec
hwm = status_kb("VmHWM")
anon = {"peak_anon_mb": round(peak_anon[0] / 1024, 1)}
print(json.dumps({"step": step, "wall_s": round(wall, 1), "peak_rss_mb": round(hwm / 1024, 1), **anon, **note}))
'''


def timed(workdir: Path, *args: str) -> dict:
    load = os.getloadavg()[0]
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = snakemake(workdir, *args)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1min": round(load, 2),
            "nothing_to_be_done": "Nothing to be done" in out.stdout + out.stderr}


def spread(runs: list[dict], key: str) -> dict:
    vals = [r[key] for r in runs]
    return {"min": min(vals), "median": round(statistics.median(vals), 2), "max": max(vals)}


def write_prompts(path: Path, n: int) -> None:
    """n distinct plain prompts of 30 words (~190 characters)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"{i}: " + " ".join(rng.choices(words, k=30))}) + "\n")


def plan_part(root: Path, model: Path, args) -> dict:
    workdir = root / "plan"
    write_prompts(workdir / "prompts.jsonl", args.prompts)
    write_config(workdir, {
        "target": {"model": str(model)},
        "prompts": {"sources": ["prompts.jsonl"], "validation": 50, "test": 50},
        "regenerate": {"shards": args.regen_shards},
        "hidden_states": {"shards": args.hs_shards},
        "tokenize": {"max_seq_len": 1024},  # the tiny target's positions
        "vocab": {"draft_vocab_size": 256},
    })
    scratch = []
    for _ in range(args.repeats):
        shutil.rmtree(workdir / ".snakemake", ignore_errors=True)
        scratch.append(timed(workdir, "-n", TARGET))
    planned = planned_jobs(workdir, TARGET)
    t0 = time.perf_counter()
    fake_finished_run(workdir, TARGET)
    snakemake(workdir, "--touch", "--forceall", "--cores", "1", TARGET)
    fake_s = time.perf_counter() - t0
    noop = [timed(workdir, "-n", TARGET) for _ in range(args.repeats)]
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([SNAKEMAKE, "--version"], capture_output=True, check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "prompts": args.prompts, "regenerate_shards": args.regen_shards, "hidden_state_shards": args.hs_shards,
        "planned_jobs": planned, "planned_total": sum(planned.values()),
        "from_scratch": {"runs": scratch, "wall_s": spread(scratch, "wall_s"), "cpu_s": spread(scratch, "cpu_s")},
        "nothing_to_be_done": {"runs": noop, "wall_s": spread(noop, "wall_s"), "cpu_s": spread(noop, "cpu_s"),
                               "all_said_nothing_to_be_done": all(r["nothing_to_be_done"] for r in noop)},
        "snakemake_version_alone": {"wall_s": round(time.perf_counter() - t0, 2),
                                    "cpu_s": round(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, 2)},
        "fake_finished_run_s": round(fake_s, 1),
    }


def regenerated_shards(root: Path, n: int, shards: int, seed: int = 0) -> dict:
    """prompts.jsonl, settings.json and `shards` shard folders of n conversations (merge's inputs):
    1-3 user turns of ~200 characters, answers of ~1,000 characters (about 256 tokens)."""
    from draftline.artifacts import conversations as conversation_file
    from draftline.artifacts.hidden_states import shard_rows
    from draftline.stages.regenerate import COUNTERS, SHARD_CONVERSATIONS, SHARD_SUMMARY, Answered, write_answer_settings

    rng = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]

    def text(chars):
        return " ".join(rng.choices(words, k=chars // 6))

    prompts, answered = [], []
    for i in range(n):
        users = [text(200) for _ in range(rng.randint(1, 3))]
        prompts.append({"id": f"c{i}", "source": "synthetic", "messages": [{"role": "user", "content": u} for u in users[:1]]
                        + [m for u in users[1:] for m in ({"role": "assistant", "content": "x"}, {"role": "user", "content": u})]})
        messages = [m for u in users for m in ({"role": "user", "content": u}, {"role": "assistant", "content": text(1000)})]
        stats = {**dict.fromkeys(COUNTERS, 0), "rows_in": 1, "rows_out": 1, "turns_generated": len(users),
                 "generated_tokens": 256 * len(users), "prompt_tokens": 100 * len(users)}
        answered.append(Answered(i, f"c{i}", {"id": f"c{i}", "source": "synthetic", "messages": messages}, stats))
    conversation_file.write(root / "prompts.jsonl", prompts)
    settings = write_answer_settings(root / "prompts.jsonl", root / "settings.json", {"max_new_tokens": 256})
    for k in range(shards):
        rows = shard_rows(n, k, shards)
        folder = root / f"shard_{k}"
        folder.mkdir()
        conversation_file.write(folder / SHARD_CONVERSATIONS, (answered[i].row for i in rows))
        stats = {c: sum(answered[i].stats[c] for i in rows) for c in COUNTERS}
        (folder / SHARD_SUMMARY).write_text(json.dumps({
            "shard": k, "num_shards": shards, "row_start": rows.start, "row_stop": rows.stop, "key": settings["key"],
            **stats, "answered": len(rows), "reused": 0, "load_seconds": 0, "seconds": 1.0, "tokens_per_second": 1.0}))
    return {"prompts_mb": round((root / "prompts.jsonl").stat().st_size / 1e6, 1),
            "regenerated_mb": round(sum((root / f"shard_{k}" / SHARD_CONVERSATIONS).stat().st_size
                                        for k in range(shards)) / 1e6, 1)}


def tokenize_input(path: Path, n: int) -> dict:
    """n conversations of 1-3 turns (user ~60 characters, answer ~240), one in ten with a system
    prompt: short, so 10^5 of them tokenize in minutes on 2 cores (the count is what memory
    follows when rows are held, not their length)."""
    rng = random.Random(1)
    words = [f"w{i}" for i in range(5000)]

    def text(chars: int) -> str:
        return " ".join(rng.choices(words, k=chars // 6))

    with open(path, "w") as f:
        for i in range(n):
            messages = [{"role": "system", "content": text(60)}] if i % 10 == 0 else []
            for _ in range(rng.randint(1, 3)):
                messages += [{"role": "user", "content": text(60)}, {"role": "assistant", "content": text(240)}]
            f.write(json.dumps({"id": f"c{i}", "source": "synthetic", "messages": messages}) + "\n")
    return {"tokenize_input_mb": round(path.stat().st_size / 1e6, 1)}


def run_step(step: str, root: Path, model: Path, shards: int, src: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, "-c", STEP, step, str(root), str(model), str(shards)],
                         capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"step {step} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["src"] = str(src)
    print(result, file=sys.stderr, flush=True)
    return result


def memory_part(root: Path, model: Path, args, record: dict, save) -> None:
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    regen = root / "regen"
    regen.mkdir()
    # in a child, so the steps below are not forked from a process holding every row
    record["memory_data"] = json.loads(subprocess.run(
        [sys.executable, __file__, "--make", str(regen), "--conversations", str(args.conversations),
         "--regen-shards", str(args.regen_shards)],
        capture_output=True, text=True, env=env, check=True).stdout)
    record["memory_data"].update(tokenize_input(root / "tokenize_input.jsonl", args.conversations))
    record["memory_data"]["prompts_mb"] = round((root / "plan" / "prompts.jsonl").stat().st_size / 1e6, 1)
    record["memory_data"]["seconds_to_make"] = round(time.perf_counter() - t0)
    record["memory_commit"], record["memory_date"], record["memory_command"] = record["commit"], record["date"], record["command"]
    steps = record["memory"] = []
    for step in ("tokenize_imports", "prompts", "merge"):
        steps.append(run_step(step, root, model, args.regen_shards, REPO / "src"))
        save()
    # tokenize on the first N conversations for each size, then on all: flat growth = bounded
    for size in sorted(args.tokenize_sizes):
        with open(root / "tokenize_input.jsonl") as src, open(root / f"tokenize_input_{size}.jsonl", "w") as dst:
            for _, line in zip(range(size), src):
                dst.write(line)
        steps.append(run_step(f"tokenize:{size}", root, model, args.regen_shards, REPO / "src"))
        save()
    steps.append(run_step("tokenize", root, model, args.regen_shards, REPO / "src"))
    save()
    if args.old_src:
        steps.append(run_step("tokenize_old", root, model, args.regen_shards, Path(args.old_src)))
        save()


def markdown(r: dict) -> str:
    p = r.get("plan", {})
    lines = [f"# The plan at scale: {p.get('prompts', 0):,} prompts, {p.get('regenerate_shards')} regeneration "
             f"shards, {p.get('hidden_state_shards')} hidden-state shards", ""]
    if p:
        lines += [
            f"`snakemake -n {TARGET}` on the tiny target ({p['planned_total']:,} jobs planned from scratch). Wall "
            "seconds depend on what else runs on this shared 2-core machine (the 1-minute load when each run "
            "started is given); CPU seconds are the dry run's own cost.", "",
            "| dry run | runs | wall s min / median / max | CPU s min / median / max | load at start |",
            "|---|---|---|---|---|",
        ]
        for key, name in (("from_scratch", "from scratch (no results/, no .snakemake/)"),
                          ("nothing_to_be_done", "finished run: Nothing to be done")):
            d = p[key]
            w, c = d["wall_s"], d["cpu_s"]
            loads = [x["load_1min"] for x in d["runs"]]
            lines.append(f"| {name} | {len(d['runs'])} | {w['min']} / **{w['median']}** / {w['max']} | "
                         f"{c['min']} / **{c['median']}** / {c['max']} | {min(loads)}-{max(loads)} |")
        v = p["snakemake_version_alone"]
        lines += ["", f"`snakemake --version` alone (Snakemake's own start-up): {v['wall_s']} s wall, {v['cpu_s']} CPU s. "
                  f"Every no-op run printed \"Nothing to be done\": {p['nothing_to_be_done']['all_said_nothing_to_be_done']}. "
                  "Goal: both under 10 s."
                  + (f" (commit {p['commit']}, {p['date']})" if "commit" in p else "")]
    if r.get("memory"):
        d = r["memory_data"]
        lines += ["", f"## Peak memory at {r['conversations']:,} conversations", "",
                  f"Synthetic data: prompts {d['prompts_mb']} MB (prompts step input), regenerated answers "
                  f"{d['regenerated_mb']} MB over {r['regenerate_shards']} shards (merge input), tokenize input "
                  f"{d['tokenize_input_mb']} MB. Each step in a fresh process; peak RSS is VmHWM, imports included "
                  f"(`{r.get('memory_command', r['command'])}`, commit {r.get('memory_commit', r['commit'])}, "
                  f"{r.get('memory_date', r['date'])}).", "",
                  "Peak anonymous memory (RssAnon, sampled every 50 ms) is the step's heap; VmHWM also counts "
                  "the pages of memory-mapped files it read, which the kernel can drop. For tokenize the heap is "
                  "also given above its floor, a process with tokenize's imports and the tokenizer loaded "
                  "(`tokenize_imports`).", "",
                  "| step | code | wall s | peak RssAnon (MB) | tokenize above its floor (MB) | VmHWM (MB) | notes |",
                  "|---|---|---|---|---|---|---|"]
        skip = ("step", "wall_s", "peak_rss_mb", "peak_anon_mb", "anon_after_imports_mb", "src")
        floor = next((s.get("peak_anon_mb") for s in r["memory"] if s["step"] == "tokenize_imports"), None)
        for s in r["memory"]:
            notes = ", ".join(f"{k} {v:,}" for k, v in s.items() if k not in skip)
            code = r.get("memory_commit", r["commit"]) if s["src"] == str(REPO / "src") else s["src"]
            above = s["step"].startswith("tokenize") and s["step"] != "tokenize_imports" and floor and "peak_anon_mb" in s
            growth = round(s["peak_anon_mb"] - floor, 1) if above else ""
            lines.append(f"| {s['step']} | {code} | {s['wall_s']} | **{s.get('peak_anon_mb', '')}** | {growth} | "
                         f"{s['peak_rss_mb']} | {notes} |")
    if r.get("notes"):  # kept across runs in the JSON: what a reader needs beside the tables
        lines += ["", "Notes:", ""] + [f"- {note}" for note in r["notes"]]
    lines += ["", header_line(r)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--regen-shards", type=int, default=256)
    parser.add_argument("--hs-shards", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-plan", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--old-src", help="also measure tokenize with this src/ (another checkout)")
    parser.add_argument("--tokenize-sizes", type=lambda v: [int(x) for x in v.split(",") if x], default=[],
                        help="also tokenize the first N conversations for each N (comma-separated)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "plan_at_scale"))
    parser.add_argument("--make", help=argparse.SUPPRESS)  # internal: write the synthetic answers here
    args = parser.parse_args()
    if args.make:
        print(json.dumps(regenerated_shards(Path(args.make), args.conversations, args.regen_shards)))
        return
    record: dict = {
        **header(this_command("PYTHONPATH=src:tests .venv/bin/python"),
                 packages=("snakemake", "datasets", "transformers", "speculators")),
        "conversations": args.conversations,
        "regenerate_shards": args.regen_shards,
    }

    # a part not measured now keeps the earlier record's (each part names its own commit and date)
    earlier = json.loads(Path(args.out + ".json").read_text()) if Path(args.out + ".json").exists() else {}
    if args.skip_plan and "plan" in earlier:
        record["plan"] = earlier["plan"]
    record["notes"] = earlier.get("notes", [])
    if args.skip_memory and "memory" in earlier:
        for key in ("memory", "memory_data", "memory_commit", "memory_date", "memory_command"):
            if key in earlier:
                record[key] = earlier[key]

    def save() -> None:
        write_record(args.out, record, markdown(record))

    with tempfile.TemporaryDirectory(prefix="plan-at-scale-") as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "tiny-model")
        if not args.skip_plan:
            record["plan"] = plan_part(root, model, args)
            record["plan"]["commit"], record["plan"]["date"] = record["commit"], record["date"]
            save()
        else:
            write_prompts(root / "plan" / "prompts.jsonl", args.prompts)
        if not args.skip_memory:
            memory_part(root, model, args, record, save)
    save()
    print(Path(args.out + ".md").read_text())


if __name__ == "__main__":
    main()
