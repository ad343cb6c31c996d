"""Peak memory of regeneration's CPU steps at 100,000 conversations (no engine: answers are synthetic).

Each step runs in a fresh Python process and reports its own peak RSS (VmHWM):
- `settings`: `write_answer_settings` (rule regenerate_settings: hash and count the prompts);
- `shard_publish`: `regenerate_shard` for one shard holding every conversation, all of them
  already staged (a resumed or re-sharded job: check the staged chunks against the prompts,
  publish the shard), so no engine starts;
- `merge`: `merge_shards` over `--shards` shard folders (rule regenerate_merge);
- `baseline`: the same interpreter importing draftline.stages.regenerate and doing nothing.

    PYTHONPATH=src .venv/bin/python benchmarks/regeneration_memory.py --conversations 100000 --shards 256

Writes benchmarks/results/regeneration_memory.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record_run import REPO, header, header_line, write_record

STEP = r'''
import json, sys, time
from pathlib import Path
step, root, shards = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
from draftline.runtime.shards import ShardJob
from draftline.stages.regenerate import RegenerateSettings, merge_shards, regenerate_shard, write_answer_settings
t0 = time.perf_counter()
if step == "settings":
    write_answer_settings(root / "prompts.jsonl", root / "settings-again.json", {"max_new_tokens": 256})
elif step == "shard_publish":
    regenerate_shard("unused", root / "prompts.jsonl", root / "settings.json",
                     ShardJob(0, 1, root / "one_shard", staging_root=root / ".staging"), RegenerateSettings())
elif step == "merge":
    merge_shards([root / f"shard_{k}" for k in range(shards)], root / "settings.json",
                 root / "conversations.jsonl", root / "summary.json")
wall = time.perf_counter() - t0
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"step": step, "wall_s": round(wall, 2), "peak_rss_mb": round(hwm / 1024, 1)}))
'''


def synthetic(root: Path, n: int, shards: int, seed: int = 0) -> dict:
    """prompts.jsonl, settings.json, `shards` shard folders and the staged chunks of n conversations:
    1-3 user turns of ~200 characters, answers of ~1,000 characters (about 256 tokens)."""
    from draftline.artifacts import conversations as conversation_file
    from draftline.artifacts.hidden_states import shard_rows
    from draftline.stages.regenerate import COUNTERS, SHARD_CONVERSATIONS, SHARD_SUMMARY, Answered, Staging, write_answer_settings

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
    staging = Staging(root / ".staging", settings["key"])
    staging.prepare()
    for start in range(0, n, 256):
        staging.stage(answered[start:start + 256])
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=256)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "regeneration_memory"))
    parser.add_argument("--make", help=argparse.SUPPRESS)  # internal: write the synthetic data here
    args = parser.parse_args()
    if args.make:
        print(json.dumps(synthetic(Path(args.make), args.conversations, args.shards)))
        return
    head = header(f"PYTHONPATH=src .venv/bin/python benchmarks/regeneration_memory.py --conversations "
                  f"{args.conversations} --shards {args.shards}", commit_paths=("src",))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="regeneration-memory-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        # in a child, so the steps below are not forked from a process holding every row
        sizes = json.loads(subprocess.run(
            [sys.executable, __file__, "--make", str(root), "--conversations", str(args.conversations),
             "--shards", str(args.shards)], capture_output=True, text=True, env=env, check=True).stdout)
        print(f"synthetic data in {time.perf_counter() - t0:.0f} s: {sizes}", file=sys.stderr)
        results = []
        for step in ("baseline", "settings", "shard_publish", "merge"):
            out = subprocess.run([sys.executable, "-c", STEP, step, str(root), str(args.shards)],
                                 capture_output=True, text=True, env=env, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(results[-1], file=sys.stderr)
        merged = (root / "conversations.jsonl").read_bytes()
        published = (root / "one_shard" / "conversations.jsonl").read_bytes()
        assert merged == published, "the merge of 256 shards differs from the one-shard publish"
    record = {**head, "conversations": args.conversations, "shards": args.shards, **sizes, "steps": results}
    lines = [
        f"# Regeneration's CPU steps at {args.conversations:,} conversations",
        "",
        f"Synthetic rows (no engine): prompts.jsonl {sizes['prompts_mb']} MB, regenerated rows "
        f"{sizes['regenerated_mb']} MB over {args.shards} shards. Each step in a fresh process; peak RSS "
        "is VmHWM (the interpreter and imports included: see baseline).",
        "",
        "| step | wall seconds | peak RSS (MB) |",
        "|---|---|---|",
        *[f"| {r['step']} | {r['wall_s']} | {r['peak_rss_mb']} |" for r in results],
        "",
        "The merged file equals the one-shard publish byte for byte.",
        "",
        header_line(record),
    ]
    write_record(args.out, record, "\n".join(lines))


if __name__ == "__main__":
    main()
