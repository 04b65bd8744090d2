"""Shared pytest fixtures and marker handling for the hf_triforce test tiers."""

from __future__ import annotations

import os

import pytest
import torch

if "PYTEST_XDIST_WORKER" in os.environ:
    # One thread per xdist worker, in its subprocesses too: with torch's default (a thread per core) two workers
    # fought over CI's 2 cores and ran the suite slower than one process did.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when CUDA is not available."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def smollm2():
    """``(model, tokenizer)`` of the real SmolLM2-135M-Instruct, float32, eval mode, loaded once per session.

    The first run on a machine converts the embedded GGUF to a safetensors cache (about 20 s).
    Tests must not leave the shared model modified.
    """
    from hf_triforce.bench.smollm2 import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random chat model saved with ``save_pretrained``, as a user's model directory (one per test module)."""
    from tests.support.tiny_chat_model import save_model

    return save_model(tmp_path_factory.mktemp("tiny-chat-model"))


@pytest.fixture
def document(tmp_path):
    """A UTF-8 text file of random words."""
    from tests.support.tiny_chat_model import random_words

    return random_words(tmp_path / "doc.txt")
