import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# vLLM CPU: a small KV cache is plenty for the tiny model and keeps parallel tests cheap.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """An 8-layer random Llama (hidden 128, head_dim 64) with a local ChatML tokenizer."""
    from draftline.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_model_generation_tags(tmp_path_factory) -> Path:
    """The same tiny model, its chat template marking assistant turns with {% generation %}."""
    from draftline.testing.tiny_model import CHATML_GENERATION_TEMPLATE, build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-model-gen"), chat_template=CHATML_GENERATION_TEMPLATE
    )
