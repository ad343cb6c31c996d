"""Render conversations with the target's chat template and mask the loss to assistant tokens.

Most chat templates (SmolLM2's ChatML among them) have no `{% generation %}` tags, so
`return_assistant_tokens_mask` cannot be used. The mask comes from prefix renders instead:
for assistant turn i, the tokens that `messages[:i+1]` adds to `messages[:i]` rendered with the
generation prompt are that turn's. Trained: the answer's content and the end-of-turn token the
target emits to stop (the draft must learn to stop); not trained: system/user/template tokens,
template text after the end-of-turn token, and for an answer cut at max_new_tokens
(`"truncated": true`) the end-of-turn token the template appends (the target never emitted it).
Templates with generation tags get the same mask, cross-checked against the template's own.

The rows then go through speculators' own preprocessing (pretokenized pass-through) to the
arrow dataset and token_freq.pt that its trainer and vocab code read.

One module per idea:
- settings: what the step is given (TokenizeSettings)
- template: the target's tokenizer and chat template, rendered as vLLM's chat() renders it
  (load_tokenizer, stop_token_ids, TemplateError)
- mask: one conversation's ids, loss mask and thinking (tokenize_conversation, apply_reasoning)
- rows: every conversation tokenized, truncated, filtered and counted (iter_tokenized, new_stats)
- arrow: the kept rows streamed into an Arrow file (write_rows_arrow)
- parts: speculators' preprocessing a part at a time (part_bounds, speculators_dataset)
- job: what the rule runs, read back and published (tokenize)
"""

from draftline.stages.tokenize.arrow import ARROW_BATCH_ROWS, write_rows_arrow
from draftline.stages.tokenize.job import tokenize
from draftline.stages.tokenize.mask import THINK_CLOSE, THINK_OPEN, Tokenized, apply_reasoning, tokenize_conversation
from draftline.stages.tokenize.parts import PART_TOKENS, part_bounds, speculators_dataset
from draftline.stages.tokenize.rows import iter_tokenized, new_stats
from draftline.stages.tokenize.settings import TokenizeSettings
from draftline.stages.tokenize.template import TemplateError, has_generation_tags, load_tokenizer, stop_token_ids

__all__ = [
    "ARROW_BATCH_ROWS", "PART_TOKENS", "THINK_CLOSE", "THINK_OPEN", "TemplateError", "TokenizeSettings", "Tokenized",
    "apply_reasoning", "has_generation_tags", "iter_tokenized", "load_tokenizer", "new_stats", "part_bounds",
    "speculators_dataset", "stop_token_ids", "tokenize", "tokenize_conversation", "write_rows_arrow",
]
