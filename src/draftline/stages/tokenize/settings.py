"""What the step is given: the `tokenize:` settings (TokenizeSettings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftline.settings import DEFAULTS


@dataclass(frozen=True)
class TokenizeSettings:
    max_seq_len: int = DEFAULTS.tokenize.max_seq_len
    min_trainable_tokens: int = DEFAULTS.tokenize.min_trainable_tokens
    chat_template: str | None = None  # path to a Jinja template replacing the tokenizer's
    # target.chat_template_kwargs: the template's variables (e.g. enable_thinking)
    chat_template_kwargs: dict = field(default_factory=dict)
    trust_remote_code: bool = DEFAULTS.target.trust_remote_code
    reasoning: str = DEFAULTS.tokenize.reasoning  # train | exclude: an answer's thinking in the loss mask
