"""The target's tokenizer and chat template: the fast tokenizer (load_tokenizer), the tokens it
ends an answer with (stop_token_ids), a conversation rendered and encoded as vLLM's chat() renders
it, and the mask of a template with `{% generation %}` tags, to check the derived one against."""

from __future__ import annotations

import json
from pathlib import Path

from draftline.artifacts import conversations as conversation_file


class TemplateError(ValueError):
    """The chat template does not render in a way an assistant-only mask can be derived from."""


def load_tokenizer(target_dir: str | Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), trust_remote_code=trust_remote_code)
    if not tokenizer.is_fast:
        raise ValueError(f"{target_dir}: the tokenizer is not a fast tokenizer; the loss mask needs its offset mapping")
    return tokenizer


def stop_token_ids(target_dir: str | Path, tokenizer) -> set[int]:
    """Tokens the target ends an answer with: generation_config's eos ids and the tokenizer's eos."""
    ids = set()
    path = Path(target_dir) / "generation_config.json"
    if path.exists():
        eos = json.loads(path.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def has_generation_tags(template: str | None) -> bool:
    return template is not None and "{% generation %}" in template.replace("{%-", "{%").replace("-%}", "%}")


def encode(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    # The template writes special tokens (BOS etc.) itself; adding them again would double them.
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def render(tokenizer, messages: list[dict], chat_template: str | None, add_generation_prompt: bool,
           template_kwargs: dict | None = None) -> str:
    return tokenizer.apply_chat_template(
        conversation_file.template_messages(messages),  # tool calls and thinking as vLLM's chat() passes them
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        **(template_kwargs or {}),  # target.chat_template_kwargs (and the row's tools), as vLLM's chat() gets them
    )


def check_against_generation_tags(tokenizer, messages, chat_template, full_ids, mask, row_id, template_kwargs=None) -> None:
    enc = tokenizer.apply_chat_template(
        conversation_file.template_messages(messages),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        chat_template=chat_template,
        **(template_kwargs or {}),
    )
    if list(enc["input_ids"]) != full_ids or list(enc["assistant_masks"]) != mask:
        raise TemplateError(
            f"row {row_id!r}: the chat template's {{% generation %}} mask disagrees with the prefix-render mask; "
            "check that the generation block covers exactly the answer and its end-of-turn token"
        )
