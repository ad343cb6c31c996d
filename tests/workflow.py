"""Run the real workflow (Snakefile in this repo) in a scratch folder, as a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def write_config(workdir: Path, config: dict) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    return path


def snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: int = 1800, repo: Path = REPO,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """`snakemake` on `repo`'s Snakefile (this repo's by default) with `workdir` as its working directory."""
    env = dict(os.environ if env is None else env)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [
        SNAKEMAKE,
        "--snakefile", str(Path(repo) / "Snakefile"),
        "--directory", str(workdir),
        "--configfile", str(workdir / "config.yaml"),
        *args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stdout[-5000:]}\n{result.stderr[-8000:]}"
        )
    return result


def planned_jobs(
    workdir: Path, *targets: str, extra: tuple[str, ...] = (), repo: Path = REPO
) -> dict[str, int]:
    """Rule name -> job count from a dry run's 'Job stats' table ({} when nothing is planned)."""
    out = snakemake(workdir, "-n", *extra, *targets, repo=repo)
    return job_counts(out.stdout + out.stderr)


def job_counts(dry_run_output: str) -> dict[str, int]:
    """Rule name -> job count from a dry run's printed 'Job stats' table."""
    lines = dry_run_output.splitlines()
    counts: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line.split()[:2] == ["job", "count"]:
            for row in lines[i + 2 :]:
                parts = row.split()
                if len(parts) != 2 or parts[0] == "total":
                    break
                counts[parts[0]] = int(parts[1])
            break
    counts.pop("all", None)
    return counts


# What a copy of the workflow needs (a test may edit the copy's code, never the repo's).
WORKFLOW_PARTS = (
    "Snakefile", "rules", "scripts", "src", "config", "profiles", "requirements", "envs", "resources",
)


def copy_workflow(dest: Path) -> Path:
    """A copy of this repo's workflow: its code, config, profiles, requirements and the prompts
    the default config names (resources/)."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / part)
    return dest


def copy_run(workdir: Path, dest: Path) -> Path:
    """A copy of a finished run's folder (results, Snakemake's metadata), mtimes and links kept,
    so a test can change its inputs without touching the shared run."""
    shutil.copytree(workdir, dest, symlinks=True)
    return dest


def fake_finished_run(workdir: Path, *targets: str, repo: Path = REPO) -> None:
    """Make `workdir` look like a finished run without running a job: a placeholder for every
    output of the DAG (a folder where the path has no suffix), then `--touch` so Snakemake
    records their metadata (params, input set, code checksums) in job order."""
    out = snakemake(workdir, "--summary", *targets, repo=repo)
    for line in out.stdout.splitlines()[1:]:
        path = line.split("\t")[0].strip()
        if not path or path.startswith(("/", "..")):
            continue  # a target folder used in place is an input, not ours to fake
        p = workdir / path
        if p.exists():
            continue
        if p.suffix:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("placeholder\n")
        else:
            p.mkdir(parents=True)
    snakemake(workdir, "--touch", "--cores", "1", *targets, repo=repo)
    # Again: Snakemake runs ready jobs in no fixed order, and before checkpoint regenerate_merge has
    # run the jobs after it are not known, so the first pass may touch train before tokenize.
    snakemake(workdir, "--touch", "--cores", "1", *targets, repo=repo)


# Regeneration's jobs with the default one shard: its settings (the answer key), the shard, the merge.
REGENERATION = {"regenerate_settings": 1, "regenerate_shard": 1, "regenerate_merge": 1}
# What a dry run of results/lineage.json plans after a change at each stage (the tiny configs
# use the target folder in place: no target_model job). The lineage covers the evaluation and
# the report's plots, so they follow training.
# Training reruns each set's evaluation (validation and test) and their gathering, not the
# untrained baseline (it depends on the config and vocab maps only).
AFTER_TRAIN = {
    "train": 1, "evaluate_set": 2, "evaluate": 1, "report_loss": 1, "report_acceptance": 1, "report_wall_times": 1,
    "lineage": 1,
}
AFTER_TOKENIZE = {
    "tokenize": 1, "hidden_states_disk_estimate": 1, "hidden_states_shard": 2, "hidden_states_view": 1,
    "report_hidden_states_disk": 1, "vocab": 1, "report_vocab_coverage": 1, "evaluate_baseline": 1, **AFTER_TRAIN,
}


def fake_tiny_project(workdir: Path, model: Path, repo: Path, rows: int = 8) -> Path:
    """A tiny config on `model` with `rows` plain prompts, faked as a finished run of `repo`'s
    workflow up to results/lineage.json, every job recorded as a real run records it."""
    (workdir / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(rows)))
    write_config(workdir, {
        "target": {"model": str(model)},
        "prompts": {"sources": ["prompts.jsonl"], "validation": 1, "test": 1},
        "tokenize": {"max_seq_len": 256},
        "hidden_states": {"shards": 2},
        "vocab": {"draft_vocab_size": 256},
    })
    fake_finished_run(workdir, "results/lineage.json", repo=repo)
    snakemake(workdir, "--touch", "--forceall", "--cores", "1", "results/lineage.json", repo=repo)
    return workdir


def load_published_draft(final: Path):
    """speculators' model of a published draft, its verifier read from the local target the run
    trained against (final/config.json names the target by hub id or folder name, which this
    machine cannot download: docs/pipeline.md, "Several targets side by side")."""
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(final))
    provenance = json.loads((Path(final) / "draftline_provenance.json").read_text())
    config.speculators_config.verifier.name_or_path = provenance["verifier"]["local_path"]
    return SpeculatorModel.from_pretrained(str(final), config=config)



VLLM_SPECULATIVE_DECODING = r"""
import json, sys

from vllm import LLM, SamplingParams


def main(target, draft, compare_plain):
    prompts = ["Tell me about the sea.", "Here is something about", "The capital of France"]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    result = {}
    spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": 2}
    for name, speculative_config in [("spec", spec), ("plain", None)][: 2 if compare_plain else 1]:
        llm = LLM(model=target, speculative_config=speculative_config, disable_log_stats=False,
                  enforce_eager=True, dtype="float32", max_model_len=512)
        result[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        if speculative_config:
            result["metrics"] = {m.name: getattr(m, "value", None) for m in llm.get_metrics()
                                 if m.name.startswith("vllm:spec_decode")}
        del llm
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":  # vLLM spawns its engine process
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "compare")
"""


def speculative_decoding_in_vllm(target: Path, draft: Path, scratch: Path, compare_plain: bool = True) -> dict:
    """vLLM CPU serving `draft` as the EAGLE-3 draft of `target` (greedy, 3 prompts x 16 tokens),
    in a child process (an engine in the test process would leave its environment behind): the
    outputs ("spec", and "plain" without the draft when `compare_plain`) and the
    `vllm:spec_decode*` counters ("metrics")."""
    script = Path(scratch) / "vllm_speculative_decoding.py"
    script.write_text(VLLM_SPECULATIVE_DECODING)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), str(target), str(draft), "compare" if compare_plain else "spec-only"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))
