"""The offline real assets: SmolLM2-135M-Instruct weights and the Python reference text."""

from __future__ import annotations

import pytest
import torch

from hf_triforce.bench.documents import python_reference_text
from hf_triforce.bench.smollm2 import SMOLLM2_GGUF_NAME, smollm2_gguf_path

pytestmark = pytest.mark.real


def test_gguf_is_found_without_import() -> None:
    path = smollm2_gguf_path()
    assert path.name == SMOLLM2_GGUF_NAME
    assert path.stat().st_size > 90_000_000


def test_architecture_facts(smollm2) -> None:
    model, tokenizer = smollm2
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert config.num_hidden_layers == 30
    assert config.num_attention_heads == 9
    assert config.num_key_value_heads == 3
    assert config.hidden_size == 576
    assert config.vocab_size == 49152
    assert len(tokenizer) == 49152
    assert not model.training
    assert model.dtype == torch.float32
    assert getattr(model, "hf_quantizer", None) is None


def test_special_tokens(smollm2) -> None:
    model, tokenizer = smollm2
    assert tokenizer.bos_token == "<|im_start|>" and tokenizer.bos_token_id == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert model.generation_config.eos_token_id == 2


def test_chat_template_renders(smollm2) -> None:
    _, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_greedy_answer_is_sensible(smollm2) -> None:
    model, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply


def test_python_reference_text() -> None:
    text = python_reference_text()
    assert len(text) > 400_000
    assert text == python_reference_text()
    assert "assert" in text[:200]


@pytest.mark.parametrize("reserve", [1, 64, 128])
def test_question_prompt_fits_the_context(smollm2, reserve) -> None:
    """Cutting the document and re-tokenizing it can add tokens; the prompt must still leave ``reserve`` free."""
    from hf_triforce.bench.documents import question_prompt

    model, tokenizer = smollm2
    limit = model.config.max_position_embeddings
    text = python_reference_text()
    ids = question_prompt(tokenizer, text, document_tokens=None, context_limit=limit, reserve=reserve)
    assert limit - reserve - 16 <= ids.shape[1] <= limit - reserve
