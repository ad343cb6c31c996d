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

# The stages: one module (or package: its modules are the stage's) under draftline/stages/ per
# pipeline step, named like its rule file (rules/<name>.smk). name -> the step it belongs to.
STAGES = {
    "prompts": "prompts", "target_model": "target_model", "layer_ids": "layer_ids", "regenerate": "regenerate",
    "tokenize": "tokenize", "disk_estimate": "disk_estimate", "hidden_states": "hidden_states", "vocab": "vocab",
    "speculator_config": "speculator_config", "train": "train", "evaluate": "evaluate",
    "evaluate_merge": "evaluate",
    "report": "report", "summary": "summary",
}
# What stages share: the files between them, the seams, the job's runtime, the lineage, the
# plan-time layer (planning/, but for its driver) and the fidelity check; the data sources.
SHARED_PACKAGES = ("artifacts", "backends", "algorithms", "testing", "runtime", "lineage", "planning", "fidelity",
                   "sources", "settings")
SHARED_MODULES = {"draftline", "draftline.stages"}
# What runs several stages' own code: the checks on a few rows before a run (`preflight`; they
# import stages, so a fix in one reruns them) and the run's plan at parse time (`planning.plan`,
# which rules/common.smk calls). Nothing imports them.
DRIVERS = {"draftline.preflight", "draftline.planning.plan"}


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
    """The module under draftline (or under draftline.stages) that `name` is or belongs to
    (draftline.stages.train.inputs -> draftline.stages.train, draftline.backends.vllm -> draftline.backends)."""
    parts = name.split(".")
    return ".".join(parts[:3] if parts[1:2] == ["stages"] and len(parts) > 2 else parts[:2])


def _stage_modules(stages) -> set[str]:
    """The modules of `stages`: each stage's module, or its package with every module in it."""
    tops = {f"draftline.stages.{s}" for s in stages}
    return {m for m in MODULES if _top(m) in tops}


def _driver(name: str) -> str | None:
    return next((d for d in DRIVERS if name == d or name.startswith(d + ".")), None)


def test_the_stage_list_names_every_module_outside_the_shared_layers():
    outside = {_driver(m) or _top(m) for m in MODULES
               if m not in SHARED_MODULES and (_driver(m) or m.split(".")[1] not in SHARED_PACKAGES)}
    assert outside == {f"draftline.stages.{s}" for s in STAGES} | DRIVERS, \
        "a new module: add it to STAGES, DRIVERS or the shared layers"


def test_each_stage_is_named_like_its_rule_file_and_script():
    """draftline/stages/ holds the stages and nothing else; a stage, its rules file and its script
    share one name (a stage with several scripts: <name>.py or <name>_<part>.py)."""
    found = {p.stem for p in (PACKAGE / "stages").iterdir() if p.name != "__init__.py" and p.name != "__pycache__"}
    assert found == set(STAGES)
    scripts = {p.stem for p in (REPO / "scripts").glob("*.py")}
    for name, step in STAGES.items():
        if step != name:
            continue  # a part of a stage with its own rules file (evaluate_merge)
        assert (REPO / "rules" / f"{name}.smk").is_file(), f"rules/{name}.smk"
        assert name in scripts or any(s.startswith(f"{name}_") for s in scripts), f"scripts/{name}.py"


def test_no_script_reads_the_config():
    """A setting reaches a job through its rule's params only (a plain value Snakemake compares, or a
    settings object it does not: rules/common.smk), never `snakemake.config`, which a job reads
    outside both staleness and its provenance.json."""
    scripts = [p for p in sorted((REPO / "scripts").rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    readers = [p.name for p in scripts if "snakemake.config" in p.read_text()]
    assert readers == [], f"scripts/ reading snakemake.config (pass the value as a param): {readers}"


def test_no_module_imports_a_driver():
    for name in MODULES:
        imported = {m for m in GRAPH[name] if _driver(m) and _driver(m) != _driver(name)}
        assert not imported, f"{name} imports {imported}"


def test_the_settings_are_the_bottom_layer():
    """draftline.settings (the config's typed blocks, their defaults, the schema) imports no other
    draftline package: everything reads its settings there, so it can stand below everything."""
    for name in _package_modules("settings"):
        outside = {m for m in GRAPH[name] if not m.startswith("draftline.settings")}
        assert not outside, f"{name} imports {outside}"


# Below the plan (planning/ drives the stages, and only the drivers and scripts import it): what reads a
# setting, its default or its check against the target reads it from draftline.settings.
BELOW_PLANNING = ("settings", "artifacts", "backends", "algorithms", "testing", "runtime", "lineage", "fidelity", "sources",
                  "stages")


@pytest.mark.parametrize("layer", BELOW_PLANNING)
def test_the_layers_below_planning_never_import_it(layer):
    for name in _package_modules(layer):
        upward = {m for m in GRAPH[name] if m.startswith("draftline.planning")}
        assert not upward, f"{name} imports {upward}"


def _package_modules(package: str) -> set[str]:
    return {m for m in MODULES if m == f"draftline.{package}" or m.startswith(f"draftline.{package}.")}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_stage_imports_no_other_stage(stage):
    others = _stage_modules(s for s, step in STAGES.items() if step != STAGES[stage])
    for name in _stage_modules([stage]):
        assert not GRAPH[name] & others, f"{name} imports {GRAPH[name] & others}"


@pytest.mark.parametrize("layer", [p for p in SHARED_PACKAGES if p != "testing"])
def test_the_shared_layers_import_no_stage(layer):
    stages = _stage_modules(STAGES)
    for name in MODULES:
        if name.startswith(f"draftline.{layer}") and not _driver(name):
            assert not GRAPH[name] & stages, f"{name} imports {GRAPH[name] & stages}"


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
    from draftline.settings import default
    from draftline.stages.evaluate import EvaluateSettings
    from draftline.stages.regenerate import RegenerateSettings
    from draftline.stages.tokenize import TokenizeSettings
    from draftline.stages.train import TrainSettings

    assert TrainSettings().epochs == default("train", "epochs")
    assert RegenerateSettings().max_new_tokens == default("regenerate", "max_new_tokens")
    assert EvaluateSettings().num_speculative_tokens == default("evaluate", "num_speculative_tokens")
    assert TokenizeSettings().max_seq_len == EvaluateSettings().max_model_len == default("tokenize", "max_seq_len")
    with pytest.raises(KeyError, match="no default for train.no_such_key"):
        default("train", "no_such_key")


# Where the null of a vllm.* setting is decided (the schema's default stands for "vLLM's own" or
# for another setting): gpu_memory_utilization's share per engine kind, max_model_len's context.
ONE_DEFAULT = {("vllm_engine.py", "gpu_memory_share"), ("vllm_engine.py", "planned_max_model_len")}


def test_each_engine_setting_has_one_default():
    """A vllm.* setting's default is the schema's (the validated config holds it; a settings field
    takes `DEFAULTS.vllm.key`), and its null is resolved in one function (ONE_DEFAULT): nothing in
    src/ decides a second one, as a `.get(key, 0.9)`, a `value or 0.9`, a field or parameter
    `= 0.9`, a `gpu_memory_utilization=0.9` argument or a GPU_MEMORY constant of its own."""
    schema = yaml.safe_load((REPO / "config" / "schema" / "config.schema.yaml").read_text())
    keys = set(schema["properties"]["vllm"]["properties"])

    def names_key(node) -> bool:
        """`node` reads a vllm.* setting: x.get("key"), x["key"] or x.key."""
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and node.args:
            return isinstance(node.args[0], ast.Constant) and node.args[0].value in keys
        if isinstance(node, ast.Subscript):
            return isinstance(node.slice, ast.Constant) and node.slice.value in keys
        return isinstance(node, ast.Attribute) and node.attr in keys

    def schema_default(node) -> bool:
        """`node` reads the one default: default("vllm", key) or DEFAULTS.vllm.key."""
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            return node.value.attr == "vllm" and getattr(node.value.value, "id", None) == "DEFAULTS"
        return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "default" and \
            bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "vllm"

    def literal(node) -> bool:
        return isinstance(node, ast.Constant) and node.value is not None

    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(SRC))

        def visit(node, func, where=where, path=path):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                func = node.name
                args = node.args.posonlyargs + node.args.args
                defaults = [None] * (len(args) - len(node.args.defaults)) + node.args.defaults
                for arg, value in [*zip(args, defaults), *zip(node.args.kwonlyargs, node.args.kw_defaults)]:
                    if arg.arg in keys and value is not None and literal(value):
                        offenders.append(f"{where}:{node.lineno} {func}({arg.arg}={ast.unparse(value)})")
            line = f"{where}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call):
                if getattr(node.func, "attr", None) == "get" and names_key(node) and (len(node.args) > 1 or node.keywords):
                    offenders.append(f"{line} {ast.unparse(node)}")
                offenders.extend(f"{line} {kw.arg}={ast.unparse(kw.value)}" for kw in node.keywords
                                 if kw.arg in keys and literal(kw.value))
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and (path.name, func) not in ONE_DEFAULT:
                if names_key(node.values[0]) or any(schema_default(v) for v in node.values):
                    offenders.append(f"{line} {ast.unparse(node)}")
            if isinstance(node, ast.IfExp) and (path.name, func) not in ONE_DEFAULT:
                if any(names_key(n) for n in ast.walk(node.test)) and \
                        any(literal(v) or schema_default(v) for v in (node.body, node.orelse)):
                    offenders.append(f"{line} {ast.unparse(node)}")
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in keys \
                    and node.value is not None and literal(node.value):
                offenders.append(f"{line} {ast.unparse(node)}")
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and literal(node.value) and \
                    type(node.value.value) in (int, float):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    name = getattr(target, "id", "")
                    if "GPU_MEMORY" in name.upper() and name not in keys and path.name != "vllm_engine.py":
                        offenders.append(f"{line} {name} = {ast.unparse(node.value)}")
            for child in ast.iter_child_nodes(node):
                visit(child, func)

        visit(ast.parse(path.read_text()), "<module>")
    assert offenders == [], "a second default of a vllm.* setting (the schema holds it; see ONE_DEFAULT):\n" + \
        "\n".join(offenders)
