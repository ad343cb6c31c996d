"""The target stage: resolving target.model, checking local folders, chat-template views,
and (slow) materializing the embedded SmolLM2 from its GGUF."""

import json
import shutil
from pathlib import Path

import pytest

from draftline.target_model import (
    EMBEDDED_NAME,
    TargetError,
    build_target,
    check_target_folder,
    resolve_target,
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


def test_hub_id_needs_a_rule(tmp_path):
    spec = resolve_target("HuggingFaceTB/SmolLM2-360M-Instruct", repo_root=tmp_path)
    assert (spec.kind, spec.needs_rule, spec.name) == ("hub", True, "SmolLM2-360M-Instruct")
    assert spec.dir == Path("resources/target/SmolLM2-360M-Instruct")


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
    from draftline.checks import EMBEDDED_SHAPE, shape_from_config

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
    from draftline.prompts import normalize_row

    lines = (PROMPTS_DIR / "default.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(set(lines)) == len(lines) >= 800
    for row in rows:
        normalize_row(row, regenerate_enabled=True)
    with_system = sum(r["messages"][0]["role"] == "system" for r in rows)
    multi_turn = sum(sum(m["role"] == "user" for m in r["messages"]) > 1 for r in rows)
    assert 0.03 * len(rows) <= with_system <= 0.08 * len(rows)
    assert multi_turn >= 15
