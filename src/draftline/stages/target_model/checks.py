"""The checks of a target folder: by file names (config, weights, tokenizer, chat template;
check_target_folder), and by loading it as later stages do (verify_target)."""

from __future__ import annotations

import json
from pathlib import Path

from draftline.stages.target_model.spec import TargetError

# Files that carry a chat template; the override replaces all of them with chat_template.jinja.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
PROBE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def _has_chat_template(folder: Path) -> bool:
    if any((folder / f).is_file() for f in TEMPLATE_FILES):
        return True
    tok_cfg = folder / "tokenizer_config.json"
    if tok_cfg.is_file():
        try:
            return bool(json.loads(tok_cfg.read_text()).get("chat_template"))
        except json.JSONDecodeError as err:
            raise TargetError(f"{tok_cfg}: not valid JSON ({err}); repair or replace the file") from err
    return False


def check_target_folder(folder: str | Path, *, has_template_override: bool = False) -> None:
    """Check (by file names) that `folder` holds a config, weights, a tokenizer and a chat template."""
    folder = Path(folder)
    where = f"target model folder {folder.resolve()}"
    if not (folder / "config.json").is_file():
        raise TargetError(
            f"{where}: config.json is missing; point target.model at a Hugging Face model folder "
            "(one written by save_pretrained)"
        )
    weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    if not weights:
        raise TargetError(
            f"{where}: no weights (*.safetensors or pytorch_model*.bin); save the model there "
            "with save_pretrained"
        )
    if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        raise TargetError(
            f"{where}: no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); save the tokenizer "
            "there with tokenizer.save_pretrained"
        )
    if not has_template_override and not _has_chat_template(folder):
        raise TargetError(
            f"{where}: no chat template (no {' or '.join(TEMPLATE_FILES)}, no 'chat_template' in "
            "tokenizer_config.json); the conversations are rendered with it. Set "
            "target.chat_template to a Jinja template file, or add chat_template.jinja to the folder"
        )


def verify_target(folder: str | Path, trust_remote_code: bool = False) -> dict:
    """Load the config and tokenizer the way later stages do and render a probe conversation.

    Returns a summary (layers, hidden size, vocab, eos) for logs and provenance.
    """
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(folder)
    check_target_folder(folder)
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except ValueError as err:
        if "trust_remote_code" in str(err) and not trust_remote_code:
            raise TargetError(
                f"target model folder {folder}: it needs code shipped with the model ({err}). Set "
                "target.trust_remote_code: true only if you trust that code"
            ) from err
        raise
    try:
        text = tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja errors have many types; say which template failed
        raise TargetError(
            f"target model folder {folder}: its chat template fails on a system/user/assistant/user "
            f"conversation ({type(err).__name__}: {err}); fix the template or set "
            "target.chat_template"
        ) from err
    missing = [m["content"] for m in PROBE[1:] if m["content"] not in text]
    if missing:
        raise TargetError(
            f"target model folder {folder}: its chat template drops message text {missing!r}; "
            "fix the template or set target.chat_template"
        )
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if tokenizer.eos_token is None:
        raise TargetError(f"target model folder {folder}: the tokenizer has no eos token")
    return {
        "model_type": config.model_type,
        "num_hidden_layers": text_config.num_hidden_layers,
        "hidden_size": text_config.hidden_size,
        "vocab_size": text_config.vocab_size,
        "tokenizer_size": len(tokenizer),
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
    }
