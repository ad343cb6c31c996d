import json
import shutil
from pathlib import Path

import pytest

from draftline.target_model import (
    EMBEDDED_GGUF,
    TargetModelError,
    build_target,
    resolve_target,
)

# A template no model ships: if the view renders with it, the override won.
OVERRIDE = (
    "{% for message in messages %}[{{ message['role'] | upper }}] {{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)


@pytest.fixture
def model_copy(tiny_model, tmp_path) -> Path:
    """A private copy of the tiny model that a test may break."""
    return Path(shutil.copytree(tiny_model, tmp_path / "my-model"))


@pytest.fixture
def override(tmp_path) -> Path:
    path = tmp_path / "override.jinja"
    path.write_text(OVERRIDE)
    return path


def test_embedded_is_built_by_the_rule_under_resources():
    spec = resolve_target("embedded")
    assert spec.kind == "embedded"
    assert spec.needs_rule
    assert spec.dir == Path("resources/target/SmolLM2-135M-Instruct")
    assert Path(spec.source).name == EMBEDDED_GGUF and Path(spec.source).is_file()
    assert resolve_target("embedded", name="smol").dir == Path("resources/target/smol")


def test_local_folder_is_used_in_place(tiny_model, monkeypatch):
    spec = resolve_target(str(tiny_model))
    assert (spec.kind, spec.needs_rule, spec.dir) == ("local", False, tiny_model.resolve())
    # A relative path that is not under the working directory is looked up in the repo.
    monkeypatch.chdir(tiny_model.parent.parent)
    spec = resolve_target(tiny_model.name, repo_root=tiny_model.parent)
    assert spec.dir == tiny_model.resolve()


def test_hub_id_is_downloaded_by_the_rule():
    spec = resolve_target("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert (spec.kind, spec.needs_rule) == ("hub", True)
    assert spec.dir == Path("resources/target/SmolLM2-135M-Instruct")
    assert resolve_target("org/model", name="mine").dir == Path("resources/target/mine")


@pytest.mark.parametrize("model", ["./no-such-model", "models/no/such-model", "/no/such/model"])
def test_missing_local_folder_fails_naming_it(model):
    with pytest.raises(TargetModelError, match="target.model") as err:
        resolve_target(model)
    assert model in str(err.value)


def test_a_name_with_a_slash_is_refused():
    with pytest.raises(TargetModelError, match="target.name"):
        resolve_target("embedded", name="../elsewhere")


@pytest.mark.parametrize(
    "remove, expected",
    [
        (["config.json"], "config.json is missing"),
        (["tokenizer.json"], "no tokenizer files"),
        (["model.safetensors"], "no weights"),
        (["chat_template.jinja"], "no chat template"),
    ],
)
def test_incomplete_local_folder_says_what_is_missing(model_copy, remove, expected):
    for name in remove:
        (model_copy / name).unlink()
    with pytest.raises(TargetModelError) as err:
        resolve_target(str(model_copy))
    assert str(model_copy) in str(err.value)
    assert expected in str(err.value)


def test_all_problems_are_listed_at_once(model_copy):
    (model_copy / "config.json").unlink()
    (model_copy / "chat_template.jinja").unlink()
    with pytest.raises(TargetModelError) as err:
        resolve_target(str(model_copy))
    assert "config.json is missing" in str(err.value) and "no chat template" in str(err.value)


def test_missing_override_file_fails_at_parse_time(tiny_model, tmp_path):
    with pytest.raises(TargetModelError, match="target.chat_template"):
        resolve_target(str(tiny_model), chat_template=tmp_path / "missing.jinja")


def test_override_view_loads_and_renders_with_the_override(model_copy, override, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    original = (model_copy / "chat_template.jinja").read_text()
    (model_copy / "chat_template.jinja").unlink()  # the override supplies the missing template
    monkeypatch.chdir(tmp_path)
    spec = resolve_target(str(model_copy), chat_template=override)
    assert (spec.kind, spec.needs_rule, spec.dir) == ("local", True, Path("resources/target/my-model"))

    view = build_target(spec, spec.dir)
    tokenizer = AutoTokenizer.from_pretrained(view)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "[USER] Hi<|im_end|>\n[ASSISTANT] "
    # The weights are the user's (linked, not copied) and the user's folder is untouched.
    assert (view / "model.safetensors").resolve() == (model_copy / "model.safetensors").resolve()
    assert not (model_copy / "chat_template.jinja").exists()
    assert "chat_template" not in json.loads((model_copy / "tokenizer_config.json").read_text())
    assert original != OVERRIDE


def test_override_replaces_a_template_kept_in_tokenizer_config(model_copy, override, tmp_path):
    # Older saves keep the template inside tokenizer_config.json; the view must not use it.
    config_path = model_copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (model_copy / "chat_template.jinja").read_text()
    config_path.write_text(json.dumps(config))
    (model_copy / "chat_template.jinja").unlink()
    spec = resolve_target(str(model_copy), chat_template=override, name="view")
    view = build_target(spec, tmp_path / "view")

    from transformers import AutoTokenizer

    rendered = AutoTokenizer.from_pretrained(view).apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False
    )
    assert rendered.startswith("[USER] Hi")
    assert "chat_template" in json.loads(config_path.read_text())  # the user's file is intact


def test_a_broken_override_publishes_nothing(model_copy, tmp_path):
    dropping = tmp_path / "drops.jinja"
    dropping.write_text("{% for message in messages %}{{ message['role'] }}{% endfor %}")
    spec = resolve_target(str(model_copy), chat_template=dropping)
    out = tmp_path / "view"
    with pytest.raises(TargetModelError, match="drops message content"):
        build_target(spec, out)
    assert not out.exists()
    assert not list(tmp_path.glob(".view.tmp-*"))


def test_remote_code_is_never_run_unless_allowed(model_copy, override, tmp_path):
    marker = tmp_path / "remote-code-ran"
    (model_copy / "custom_config.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import LlamaConfig\n\n"
        "class CustomConfig(LlamaConfig):\n    model_type = 'custom-llama'\n"
    )
    config = json.loads((model_copy / "config.json").read_text())
    config.update(model_type="custom-llama", auto_map={"AutoConfig": "custom_config.CustomConfig"})
    (model_copy / "config.json").write_text(json.dumps(config))
    spec = resolve_target(str(model_copy), chat_template=override)

    with pytest.raises(TargetModelError, match="target.trust_remote_code"):
        build_target(spec, tmp_path / "view")
    assert not marker.exists()
    build_target(spec, tmp_path / "view", trust_remote_code=True)
    assert marker.exists()


@pytest.mark.slow
def test_embedded_materializes_a_chatml_smollm2_that_answers(tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = resolve_target("embedded")
    out = build_target(spec, tmp_path / "smollm2")

    config = AutoConfig.from_pretrained(out)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert not hasattr(config, "quantization_config")
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|im_end|>"
    question = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.float32
    ids = tokenizer.apply_chat_template(
        question, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        generated = model.generate(**ids, max_new_tokens=16, do_sample=False)
    assert "Paris" in tokenizer.decode(generated[0, ids["input_ids"].shape[1] :])
