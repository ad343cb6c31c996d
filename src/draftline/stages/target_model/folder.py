"""What draftline writes into a target folder being built: the chat-template override, the
tokenizer config cleaned of loader bookkeeping, the provenance record (draftline_target.json)."""

from __future__ import annotations

import json
from pathlib import Path

from draftline.stages.target_model.checks import TEMPLATE_FILES
from draftline.stages.target_model.spec import PROVENANCE_FILE


def write_chat_template(folder: Path, template: str) -> None:
    """Make `template` the folder's only chat template (chat_template.jinja wins in transformers)."""
    for fname in TEMPLATE_FILES:
        (folder / fname).unlink(missing_ok=True)
    tok_cfg_path = folder / "tokenizer_config.json"
    if tok_cfg_path.exists():
        tok_cfg = json.loads(tok_cfg_path.read_text())
        tok_cfg_path.unlink()  # may be a symlink into the user's folder: never write through it
        tok_cfg.pop("chat_template", None)
        tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    (folder / "chat_template.jinja").write_text(template)


def clean_tokenizer_config(path: Path) -> None:
    # Drop loader bookkeeping that save_pretrained copies in; PreTrainedTokenizerFast is the
    # class name transformers 4.x and 5.x both load from tokenizer.json.
    cfg = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "gguf_file"):
        cfg.pop(key, None)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def write_provenance(folder: Path, chat_template, summary: dict, **record) -> None:
    import transformers

    record = {
        **record,
        "chat_template": str(chat_template) if chat_template else None,
        "transformers": transformers.__version__,
        **summary,
    }
    (folder / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
