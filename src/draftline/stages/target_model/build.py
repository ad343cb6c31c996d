"""Building the folder `resolve_target` promised (build_target): the embedded model materialized,
a view of symlinks with another chat template (build_template_view), or a hub model downloaded."""

from __future__ import annotations

import logging
from pathlib import Path

from draftline.runtime.atomic import atomic_dir
from draftline.stages.target_model.checks import TEMPLATE_FILES, check_target_folder, verify_target
from draftline.stages.target_model.embedded import materialize_embedded
from draftline.stages.target_model.folder import write_chat_template, write_provenance
from draftline.stages.target_model.hub import download_hub
from draftline.stages.target_model.spec import PROVENANCE_FILE, TargetError, TargetSpec

log = logging.getLogger(__name__)


def build_template_view(source: str | Path, out_dir: str | Path, chat_template: str | Path,
               trust_remote_code: bool = False, record: dict | None = None) -> Path:
    """A folder of symlinks to a local model whose chat template is replaced by `chat_template`.

    `record` (kind, source, ...) replaces the default provenance record of a local source."""
    source = Path(source).resolve()
    check_target_folder(source, has_template_override=True)
    template = Path(chat_template).read_text()
    with atomic_dir(out_dir) as staging:
        for entry in sorted(source.iterdir()):
            if entry.name in TEMPLATE_FILES or entry.name == PROVENANCE_FILE:
                continue
            (staging / entry.name).symlink_to(entry)
        write_chat_template(staging, template)
        summary = verify_target(staging, trust_remote_code)
        write_provenance(staging, chat_template, summary, **(record or {"kind": "local", "source": str(source)}))
    log.info("target view %s -> %s with chat template %s: %s", out_dir, source, chat_template, summary)
    return Path(out_dir)


def build_target(spec: TargetSpec, out_dir: str | Path, *, trust_remote_code: bool = False) -> Path:
    """Build the folder `resolve_target` promised: materialize, view or download."""
    if not spec.needs_rule:
        raise TargetError(f"target {spec.source} is a local folder used in place; nothing to build")
    if spec.kind == "embedded":
        return materialize_embedded(out_dir, spec.chat_template)
    if spec.kind == "local":
        return build_template_view(spec.source, out_dir, spec.chat_template, trust_remote_code)
    hub = {"kind": "hub", "source": spec.source, "revision": spec.revision, "commit": spec.commit}
    if spec.snapshot is not None:  # cached: a view of the snapshot, no copy
        return build_template_view(spec.snapshot, out_dir, spec.chat_template, trust_remote_code, record=hub)
    return download_hub(spec.source, out_dir, spec.chat_template, trust_remote_code, spec.commit, spec.revision)
