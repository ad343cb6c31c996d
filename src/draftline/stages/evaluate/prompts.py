"""The prompt sets: each set's rows as first-turn chat prompts (read_prompts, read_sets) and those
with room for the answer within max_model_len (fitting_prompts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftline.sources import read_first_turns
from draftline.stages.evaluate.settings import EvaluateSettings

# the set whose figures are reported (no choice looks at them)
HEADLINE_SET = "test"


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict]


def read_prompts(path: str | Path, max_prompts: int | None = None) -> list[Prompt]:
    """A prompt set's rows as first-turn chat prompts (system + first user turn, as
    regeneration's turn 1); any format the prompts stage reads."""
    rows = read_first_turns(str(path))
    if max_prompts is not None:
        rows = rows[:max_prompts]
    return [Prompt(row_id, messages) for row_id, messages in rows]


def read_sets(prompt_sets: dict[str, str | Path], settings: EvaluateSettings) -> tuple[dict[str, list[Prompt]], list[str]]:
    """name -> its prompts (at most settings.max_prompts), and the names of the empty sets, left out."""
    sets = {name: read_prompts(path, settings.max_prompts) for name, path in prompt_sets.items()}
    empty = sorted(name for name, prompts in sets.items() if not prompts)
    sets = {name: prompts for name, prompts in sets.items() if prompts}
    if not sets:
        raise ValueError(
            f"no prompts to evaluate on in {dict(prompt_sets)}: set prompts.validation or prompts.test "
            "above 0, or name a non-empty file in evaluate.prompt_sets"
        )
    return sets, empty


def fitting_prompts(
    tokenizer, prompts: list[Prompt], settings: EvaluateSettings, chat_template: str | None
) -> tuple[list[Prompt], list[str]]:
    """Prompts with room for max_new_tokens within max_model_len, and the ids left out."""
    kept, skipped = [], []
    for prompt in prompts:
        text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True, chat_template=chat_template,
                                             **settings.chat_template_kwargs)
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n + settings.max_new_tokens <= settings.max_model_len:
            kept.append(prompt)
        else:
            skipped.append(prompt.id)
    return kept, skipped
