"""What the step is given: the `regenerate:` settings (RegenerateSettings) on the run's engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftline.runtime.vllm_engine import EngineSettings
from draftline.settings import DEFAULTS


@dataclass(frozen=True)
class RegenerateSettings(EngineSettings):
    """The `regenerate:` config block on the run's engine settings; `max_model_len` is
    tokenize.max_seq_len unless vllm.max_model_len, so nothing generated is cut later."""

    max_new_tokens: int = DEFAULTS.regenerate.max_new_tokens
    temperature: float = DEFAULTS.regenerate.temperature
    top_p: float = DEFAULTS.regenerate.top_p
    chat_template: str | None = None  # path to a Jinja template replacing the tokenizer's
    # target.chat_template_kwargs: the template's variables (e.g. enable_thinking)
    chat_template_kwargs: dict = field(default_factory=dict)
    # vLLM's tool parser (its --tool-call-parser) reading the target's calls in rows with tools
    tool_call_parser: str = DEFAULTS.regenerate.tool_call_parser
    chunk_conversations: int = DEFAULTS.regenerate.chunk_conversations  # not an answer setting
