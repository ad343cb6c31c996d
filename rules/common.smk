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
from draftline.target_model import resolve_target  # noqa: E402

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
)
TARGET_DIR = str(TARGET.dir)
SHARDS = list(range(config["hidden_states"]["shards"]))


wildcard_constraints:
    shard=r"\d+",


def code(*modules):
    """The draftline modules a step runs, as inputs: a fix in one reruns the step."""
    return [str(SRC / "draftline" / f"{m}.py") for m in modules]


def target_input():
    """The target folder, as an input (built by rule target_model unless used in place)."""
    return TARGET_DIR


def conversations_to_tokenize():
    if config["regenerate"]["enabled"]:
        return "results/regenerated/conversations.jsonl"
    return "results/prompts/prompts.jsonl"


def hidden_state_shards():
    return expand("results/hidden_states/shard_{shard}", shard=SHARDS)


def all_outputs():
    return ["results/checkpoint/final"]
