"""The layout docs/DESIGN.md describes, held by the code: stages import the shared layers and
never each other, nothing imports in a circle, and every registry entry is what its name says.
(Import-level checks read the source with `ast`; nothing heavy is imported.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGE = SRC / "draftline"

# One module (or package: its modules are the stage's) per pipeline step (train_entry is the train
# step's child process).
STAGES = {
    "prompts": "prompts", "target_model": "target_model", "layers": "layer_ids",
    "regenerate": "regenerate", "tokenization": "tokenize", "disk": "disk_estimate",
    "hidden_states": "hidden_states", "vocab": "vocab", "speculator_config": "speculator_config",
    "train": "train", "train_entry": "train", "evaluate": "evaluate", "report": "report",
    "summary": "summary",
}
# What stages share: the files between them, the seams, and the runtime helpers.
SHARED_PACKAGES = ("artifacts", "backends", "algorithms", "testing")
# What runs several stages' own code: the checks on a few rows before a run (`preflight`; they
# import stages, so a fix in one reruns them) and the run's plan at parse time (`planning`, which
# rules/common.smk calls). Nothing imports them.
DRIVERS = {"preflight", "planning"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """draftline modules `path` imports with an import statement (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {m for m in found if m in MODULES}


GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _top(name: str) -> str:
    """The module under draftline that `name` is or belongs to (draftline.train.inputs -> draftline.train)."""
    return ".".join(name.split(".")[:2])


def _stage_modules(stages) -> set[str]:
    """The modules of `stages`: each stage's module, or its package with every module in it."""
    tops = {f"draftline.{s}" for s in stages}
    return {m for m in MODULES if _top(m) in tops}


def test_the_stage_list_names_every_module_outside_the_shared_layers():
    shared = {"draftline", "draftline.atomic", "draftline.logs", "draftline.devices", "draftline.content_hash",
              "draftline.config_schema", "draftline.engine", "draftline.checks", "draftline.plan",
              "draftline.provenance", "draftline.sources", "draftline.sizing", "draftline.cluster",
              "draftline.target_hashes", "draftline.fidelity", "draftline.versions"}
    outside = {_top(m) for m in MODULES if m not in shared and m.split(".")[1] not in SHARED_PACKAGES}
    assert outside == {f"draftline.{s}" for s in {*STAGES, *DRIVERS}}, \
        "a new module: add it to STAGES, DRIVERS or the shared layers"


def test_no_script_reads_the_config():
    """A setting reaches a job through its rule's params only (a plain value Snakemake compares, or a
    settings object it does not: rules/common.smk), never `snakemake.config`, which a job reads
    outside both staleness and its provenance.json."""
    scripts = [p for p in sorted((REPO / "scripts").rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    readers = [p.name for p in scripts if "snakemake.config" in p.read_text()]
    assert readers == [], f"scripts/ reading snakemake.config (pass the value as a param): {readers}"


def test_no_module_imports_a_driver():
    drivers = {f"draftline.{d}" for d in DRIVERS}
    for name in MODULES:
        assert not GRAPH[name] & drivers, f"{name} imports {GRAPH[name] & drivers}"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_stage_imports_no_other_stage(stage):
    others = _stage_modules(s for s, step in STAGES.items() if step != STAGES[stage])
    for name in _stage_modules([stage]):
        assert not GRAPH[name] & others, f"{name} imports {GRAPH[name] & others}"


@pytest.mark.parametrize("layer", SHARED_PACKAGES[:3])
def test_artifacts_backends_and_algorithms_import_no_stage(layer):
    stages = _stage_modules(STAGES)
    for name in MODULES:
        if name.startswith(f"draftline.{layer}"):
            assert not GRAPH[name] & stages, name


def test_no_import_cycles():
    state: dict[str, int] = {}

    def visit(name, path):
        state[name] = 1
        for dep in GRAPH[name]:
            if state.get(dep) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path, dep]))
            if dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


def _schema_enum(block: str, key: str) -> list[str]:
    schema = yaml.safe_load((REPO / "config" / "schema" / "config.schema.yaml").read_text())
    return schema["properties"][block]["properties"][key]["enum"]


def test_every_registered_backend_is_selectable_and_named_as_registered():
    from draftline import backends

    assert sorted(backends.BACKENDS) == sorted(_schema_enum("hidden_states", "backend"))
    for name in backends.BACKENDS:
        assert backends.get(name).name == name
    with pytest.raises(ValueError, match="hidden_states.backend 'sglang': expected one of"):
        backends.get("sglang")


def test_every_registered_algorithm_is_selectable_and_named_as_speculators_names_it():
    from speculators.model import SpeculatorModel

    from draftline import algorithms

    assert sorted(algorithms.ALGORITHMS) == sorted(_schema_enum("draft", "algorithm"))
    for name in algorithms.ALGORITHMS:
        algorithm = algorithms.get(name)
        assert algorithm.name == name
        assert name in SpeculatorModel.registry  # speculators' own --speculator-type
        assert algorithm.model_class() is SpeculatorModel.registry[name]
    with pytest.raises(ValueError, match="draft.algorithm 'medusa': expected one of"):
        algorithms.get("medusa")


def test_settings_defaults_are_the_schemas():
    from draftline.config_schema import default
    from draftline.evaluate import EvaluateSettings
    from draftline.regenerate import RegenerateSettings
    from draftline.tokenization import TokenizeSettings
    from draftline.train import TrainSettings

    assert TrainSettings().epochs == default("train", "epochs")
    assert RegenerateSettings().max_new_tokens == default("regenerate", "max_new_tokens")
    assert EvaluateSettings().num_speculative_tokens == default("evaluate", "num_speculative_tokens")
    assert TokenizeSettings().max_seq_len == EvaluateSettings().max_model_len == default("tokenize", "max_seq_len")
    with pytest.raises(KeyError, match="no default for train.no_such_key"):
        default("train", "no_such_key")
