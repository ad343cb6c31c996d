"""The config's files, checked when the plan is made: a relative path that only the workflow's
folder has, and the first rows of every prompt source and prompt set (a typo, a wrong column name
or a file in the wrong format stops the run before any job starts; each error is a PlanningError),
and the prompt sets evaluated with their files (`EvaluationSets`, rules/evaluate.smk's inputs)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from draftline.sources import PromptError, check_sources, source_files


class PlanningError(ValueError):
    """The config cannot be planned; the message says what is wrong, where, and what to do."""


def check_relative_path(key: str, raw, workdir: Path, repo: Path) -> None:
    """A relative path missing from a run folder that the workflow's own folder has (a preset's
    resources/prompts/default.jsonl, say): name both, and the path that reaches it from here."""
    path = Path(str(raw)).expanduser()
    if path.is_absolute() or str(raw).startswith(("hf:", "package:")) or path.exists() or workdir == repo:
        return
    if (repo / path).exists():
        raise PlanningError(
            f"{key}: {raw} is not in the working folder (looked at {path.resolve()}): relative paths in the "
            f"config are read from the folder snakemake runs in ({workdir}, --directory), not from the "
            f"workflow's ({repo}), which has it. Write {os.path.relpath(repo / path)} (or an absolute path), "
            "or copy the file into the run folder"
        )


def check_relative_paths(config: dict, workdir: Path, repo: Path) -> None:
    for raw in config["prompts"]["sources"]:
        check_relative_path("prompts.sources", raw, workdir, repo)
    for name, raw in config["evaluate"]["prompt_sets"].items():
        check_relative_path(f"evaluate.prompt_sets.{name}", raw, workdir, repo)
    for key in ("model", "chat_template"):
        if config["target"][key] not in (None, "embedded"):
            check_relative_path(f"target.{key}", config["target"][key], workdir, repo)


def check_prompt_sources(config: dict) -> None:
    """The first rows of every source, in every format, so a typo, a wrong column name or a file in
    the wrong format stops the run before any job starts."""
    prompts = config["prompts"]
    try:
        check_sources(prompts["sources"], config["regenerate"]["enabled"], prompts["on_bad_row"],
                      leading_assistant_turn=prompts["leading_assistant_turn"])
    except (PromptError, ValueError) as error:
        raise PlanningError(f"prompts.sources: {error}") from None
    for name, raw in config["evaluate"]["prompt_sets"].items():
        try:  # evaluation stops on a bad row (draftline.sources.read_first_turns)
            check_sources([raw], regenerate_enabled=True, on_bad_row="stop")
        except (PromptError, ValueError) as error:
            raise PlanningError(f"evaluate.prompt_sets.{name}: {error}") from None


HELD_OUT_SETS = {"validation": "results/prompts/validation.jsonl", "test": "results/prompts/test.jsonl"}


@dataclass(frozen=True, eq=False)
class EvaluationSets:
    """The prompt sets evaluated, in order: validation, test, then evaluate.prompt_sets' names
    (`named`: name -> file, as the plan kept them). Its methods are rules/evaluate.smk's inputs."""

    named: dict[str, str]

    def names(self) -> list[str]:
        return [*HELD_OUT_SETS, *self.named]

    def records(self) -> list[str]:
        return [f"results/eval/sets/{name}.json" for name in self.names()]

    def source(self, wildcards) -> str:
        """A set's file as the job reads it: the held-out split, or the configured path."""
        return HELD_OUT_SETS.get(wildcards.prompt_set) or self.named[wildcards.prompt_set]

    def files(self, wildcards):
        """A set's files (a dataset folder's files too), so an edit reruns that set's evaluation."""
        if wildcards.prompt_set in HELD_OUT_SETS:
            return HELD_OUT_SETS[wildcards.prompt_set]
        return source_files([self.named[wildcards.prompt_set]])
