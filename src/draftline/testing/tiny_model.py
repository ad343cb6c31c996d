"""A tiny random Llama target with a locally trained tokenizer and a ChatML template.

Small enough for tests that take seconds, but shaped so vLLM CPU runs it (head_dim 64;
its attention kernel rejects 16) and speculators' default aux layers are distinct
([2, n//2, n-3] needs n >= 7).
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The same ChatML, but marking assistant content for `return_assistant_tokens_mask`.
CHATML_GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# ChatML with Qwen3's switch: `enable_thinking=False` (a chat-template variable, config
# target.chat_template_kwargs) opens every assistant turn with an empty think block.
NO_THINK = "<think>\n\n</think>\n"
CHATML_THINKING_TEMPLATE = (
    "{% set no_think = enable_thinking is defined and not enable_thinking %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' and no_think %}{{ '" + NO_THINK.replace("\n", "\\n") + "' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if no_think %}{{ '" + NO_THINK.replace("\n", "\\n") + "' }}{% endif %}{% endif %}"
)

# ChatML that thinks and calls tools, as Qwen3's and Hermes' templates do (but keeping earlier
# turns' thinking, so a prefix renders the same whatever follows it): an answer's
# `reasoning_content` opens it as a <think> block (an answer whose content holds its own block is
# rendered as written); `enable_thinking=False` pre-fills an empty block in the generation prompt
# and in answers without thinking; `tools` go into the system turn, calls into <tool_call> tags,
# results into <tool_response> tags of a user turn.
CHATML_AGENT_TEMPLATE = """\
{%- set no_think = enable_thinking is defined and not enable_thinking -%}
{%- if tools -%}
<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}

{% endif %}# Tools

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object within <tool_call></tool_call> tags.<|im_end|>
{% elif messages[0]['role'] == 'system' -%}
<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}
<|im_start|>user
{{ message['content'] }}<|im_end|>
{% elif message['role'] == 'assistant' -%}
<|im_start|>assistant
{% if message.get('reasoning_content') %}<think>
{{ message['reasoning_content'] }}
</think>

{% elif no_think and '</think>' not in message['content'] %}<think>

</think>

{% endif %}{{ message['content'] }}
{%- for call in message.get('tool_calls') or [] %}
<tool_call>
{"name": "{{ call['function']['name'] }}", "arguments": {{ call['function']['arguments'] | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message['role'] == 'tool' -%}
<|im_start|>user
<tool_response>
{{ message['content'] }}
</tool_response><|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if no_think %}<think>

</think>

{% endif -%}
{%- endif -%}
"""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Speculative decoding drafts several tokens and the target verifies them at once.",
    "A draft model proposes tokens; the target model accepts or rejects them.",
    "Write a short poem about the sea. The sea is wide and blue and deep.",
    "Explain how a hash table works: keys are hashed into buckets.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Math: 2 + 2 = 4.",
    "user assistant system: You are a helpful assistant. Hello! How can I help you today?",
    "Unicode: café, naïve, Grüße, 日本語, emoji 🙂, ñ, ø, ß.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "Questions? Answers! Lists: apples, pears, plums; (brackets) [square] {curly}.",
]


def train_tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer trained on a small built-in corpus (no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def build_tiny_model(
    out_dir: str | Path,
    *,
    num_layers: int = 8,
    hidden_size: int = 128,
    vocab_size: int = 512,
    max_position_embeddings: int = 1024,
    chat_template: str | None = CHATML_TEMPLATE,
    seed: int = 0,
) -> Path:
    """Write a random LlamaForCausalLM with its tokenizer to `out_dir` and return it.

    `chat_template=None` writes a tokenizer without a chat template.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tiny_tokenizer(vocab_size)
    tokenizer.chat_template = chat_template
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=hidden_size // 64,
        head_dim=64,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Zero the (tied) embeddings of special tokens and of byte pieces that are not text on
        # their own: their logits are then 0 while the others' are random around 0, so greedy
        # answers are printable text rather than an instant <|im_end|> or broken UTF-8.
        unprintable = [
            i for i in range(len(tokenizer))
            if i in tokenizer.all_special_ids or "\ufffd" in tokenizer.decode([i])
        ]
        model.model.embed_tokens.weight[unprintable] = 0.0
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # generation_config.json: greedy by default, stop at <|im_end|>.
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": tokenizer.eos_token_id, "do_sample": False}) + "\n"
    )
    return out


if __name__ == "__main__":
    import sys

    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "tiny-model"))
