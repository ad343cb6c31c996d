"""The default evaluation's named sets (resources/prompts/eval/): read as the evaluate stage
reads them, named by config/config.yaml, and never a training prompt."""

from __future__ import annotations

import json
import re

import yaml
from workflow import REPO

EVAL = REPO / "resources" / "prompts" / "eval"


def _user_turns(path):
    return [m["content"] for line in path.read_text().splitlines() for m in json.loads(line)["messages"] if m["role"] == "user"]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def test_the_default_config_measures_code_math_and_chat():
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert config["evaluate"]["prompt_sets"] == {name: f"resources/prompts/eval/{name}.jsonl" for name in ("code", "math", "chat")}


def test_named_sets_are_read_by_the_evaluate_stage_and_hold_no_training_prompt():
    from draftline.stages.evaluate import read_prompts

    training = {_norm(turn) for turn in _user_turns(REPO / "resources" / "prompts" / "default.jsonl")}
    for name in ("code", "math", "chat"):
        path = EVAL / f"{name}.jsonl"
        prompts = read_prompts(path)
        assert len(prompts) >= 16 and len({p.id for p in prompts}) == len(prompts), name
        overlap = [turn for turn in _user_turns(path) if _norm(turn) in training]
        assert not overlap, f"{name}: trained on: {overlap}"
