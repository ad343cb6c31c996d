# Config validation, the target's location, and small input functions shared by the rules.

import os
import sys
from pathlib import Path

from snakemake.utils import validate

validate(config, schema="../config/schema/config.schema.yaml")

REPO = Path(workflow.basedir)
SRC = REPO / "src"
# Every job (local, Slurm, conda) imports the step logic from src/.
sys.path.insert(0, str(SRC))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [str(SRC), os.environ.get("PYTHONPATH", "")] if p
)

from snakemake.exceptions import WorkflowError  # noqa: E402

from draftline.prompts import PromptError, check_sources, source_files  # noqa: E402
from draftline.content_hash import HashCache  # noqa: E402
from draftline.target_model import resolve_target, target_identity  # noqa: E402

# Cheap checks at parse time, so a typo stops the run before any job starts.
try:
    check_sources(
        config["prompts"]["sources"],
        config["regenerate"]["enabled"],
        config["prompts"]["on_bad_row"],
    )
except (PromptError, ValueError) as error:
    raise WorkflowError(f"prompts.sources: {error}") from None

TARGET = resolve_target(
    config["target"]["model"],
    name=config["target"]["name"],
    chat_template=config["target"]["chat_template"],
    repo_root=REPO,
    revision=config["target"]["revision"],
)
_hash_cache = HashCache(".snakemake/draftline/hash_cache.json")
TARGET_IDENTITY = target_identity(TARGET, REPO, _hash_cache)
_hash_cache.save()
TARGET_DIR = str(TARGET.dir)
SHARDS = list(range(config["hidden_states"]["shards"]))


wildcard_constraints:
    shard=r"\d+",


def code(*modules):
    """The draftline modules a step runs and every draftline module they import (parsed with
    ast, transitively), as inputs: a fix in one, or in a helper it uses, reruns the step.
    Bookkeeping the scripts import (provenance, devices) is deliberately not listed: a fix
    there changes no artifact and must not rerun hours of GPU work."""
    from draftline.provenance import module_closure

    return list(module_closure(str(SRC), tuple(modules)))


def target_input():
    """The target folder, as an input (built by rule target_model unless used in place)."""
    return TARGET_DIR


def conversations_to_tokenize():
    if config["regenerate"]["enabled"]:
        return "results/regenerated/conversations.jsonl"
    return "results/prompts/prompts.jsonl"


def evaluation_prompt_set_files():
    """The files of evaluate.prompt_sets (a dataset folder's files too), so an edit reruns evaluation."""
    return source_files(list(config["evaluate"]["prompt_sets"].values()))


def hidden_state_shards():
    return expand("results/hidden_states/shard_{shard}", shard=SHARDS)


def all_outputs():
    """The final draft (the main target), its lineage, its evaluation, and the report's plots."""
    plots = ["loss", "acceptance", "vocab_coverage", "hidden_states_disk", "wall_times"]
    return [
        "results/checkpoint/final",
        "results/lineage.json",
        "results/eval/acceptance.json",
        *expand("results/report/{plot}.png", plot=plots),
    ]




def _sort_keys(value):
    if isinstance(value, dict):
        return {k: _sort_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sort_keys(v) for v in value]
    return value


# A dict param (train=config["train"]) is compared by its repr: sorted keys, so reordering
# config.yaml or the schema's defaults never reruns a job. Lists keep their order (it matters).
for _key in sorted(config):
    config[_key] = _sort_keys(config.pop(_key))


# --- issue 6: the config against the target's shape; the hidden states' disk use -------------
# (draftline.checks, draftline.disk; the rule is in rules/disk.smk)
import json  # noqa: E402

from draftline.checks import ConfigError, check_config, target_shape  # noqa: E402
from draftline.disk import DiskLimitError, check_limit, describe, parse_time_estimate  # noqa: E402

try:
    TARGET_SHAPE = target_shape(TARGET.kind, TARGET.dir)
    check_config(config, TARGET_SHAPE)
except ConfigError as error:
    raise WorkflowError(str(error)) from None


def _hidden_state_disk_use():
    """While shards are still to extract: print the expected disk use (the rule's estimate, or
    one from the tokenized summary) and hold it to hidden_states.max_disk_gb, which may have
    changed since the rule ran (the limit is not a param, so changing it re-extracts nothing)."""
    if all(Path(d).exists() for d in hidden_state_shards()):
        return
    estimate = Path("results/hidden_states/disk_estimate.json")
    if estimate.is_file():
        est = json.loads(estimate.read_text())
    elif TARGET_SHAPE is not None:
        layer_ids = Path("results/target/layer_ids.json")
        setting = config["hidden_states"]["layer_ids"]
        if layer_ids.is_file():
            n_layers = len(json.loads(layer_ids.read_text())["extracted"])
        else:  # "auto" is speculators' 3 aux layers; the last layer is always added
            n_layers = (3 if setting == "auto" else len(setting)) + 1
        est = parse_time_estimate("results/tokenized/summary.json", TARGET_SHAPE.hidden_size,
                                  n_layers, config["target"]["dtype"])
        if est is None:
            return
    else:
        return
    print(f"draftline: {describe(est)}", file=sys.stderr)
    try:
        check_limit(est, config["hidden_states"]["max_disk_gb"])
    except DiskLimitError as error:
        raise WorkflowError(str(error)) from None


_hidden_state_disk_use()
# --- end issue 6 -------------------------------------------------------------------------------
