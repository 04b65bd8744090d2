"""TriForce on the real SmolLM2-135M-Instruct with a ~4K-token prompt of real text (the Python reference).

Greedy output must be token-identical to plain ``generate()``; with a 512-token retrieval budget (1/8 of
the context) the level-1 (retrieval view) drafts must be accepted by the full cache at least 80% of the time.
"""

from __future__ import annotations

import pytest
import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.bench.documents import python_reference_text
from tests.support.chat import Chat

pytestmark = [pytest.mark.real, pytest.mark.slow]

PROMPT_TOKENS = 4000
NEW_TOKENS = 32
BUDGET = 512


@pytest.fixture(scope="module")
def model_and_ids(smollm2):
    model, tokenizer = smollm2
    text = python_reference_text()
    ids = tokenizer(text[: PROMPT_TOKENS * 8], return_tensors="pt").input_ids[:, :PROMPT_TOKENS]
    assert ids.shape[1] == PROMPT_TOKENS
    hf_triforce.enable(model)
    yield model, ids
    hf_triforce.disable(model)


@pytest.fixture(scope="module")
def plain_output(model_and_ids):
    model, ids = model_and_ids
    return model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_greedy_identical_and_retrieval_accepted(model_and_ids, plain_output, drafter):
    model, ids = model_and_ids
    config = TriForceConfig(retrieval_budget=BUDGET, drafter=drafter)
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, triforce_config=config)
    assert torch.equal(out, plain_output)
    stats = hf_triforce.last_stats(model).to_dict()
    assert stats["new_tokens"] == NEW_TOKENS
    retrieval = stats["levels"]["level1"]
    assert retrieval["drafted"] > 0
    assert retrieval["acceptance_rate"] >= 0.8, stats


def test_greedy_identical_on_fixed_shapes(model_and_ids, plain_output):
    """``cuda_graphs="eager"``: level 1's static steps (the forwards a GPU replays as CUDA graphs): plain greedy
    output, the same acceptance bar."""
    model, ids = model_and_ids
    config = TriForceConfig(retrieval_budget=BUDGET, drafter="none", cuda_graphs="eager")
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, triforce_config=config)
    assert torch.equal(out, plain_output)
    stats = hf_triforce.last_stats(model)
    assert stats.target_forwards > 1
    assert stats.level1.acceptance_rate >= 0.8, stats.to_dict()


def test_greedy_token_trees_identical(model_and_ids, plain_output):
    """Level 1 drafts 16-node token trees (Sequoia's shape for the call's measured acceptance), the full cache verifies
    each in one forward: plain greedy output, and more tokens per verification than the trees' depth-first chain
    alone would give at this acceptance."""
    model, ids = model_and_ids
    config = TriForceConfig(retrieval_budget=BUDGET, drafter="none", tree_budget=16, adaptive=False)
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, triforce_config=config)
    assert torch.equal(out, plain_output)
    stats = hf_triforce.last_stats(model)
    assert stats.tree_rounds >= stats.target_forwards - 1 and stats.tree_nodes >= 12 * stats.tree_rounds
    assert stats.mean_accepted_length > 2.5, stats.to_dict()


def _chat(model, tokenizer, turns: list[str], **extra) -> Chat:
    chat = Chat(model, tokenizer, {"max_new_tokens": 24, "do_sample": False, **extra})
    for text in turns:
        chat.say(text)
    return chat


@pytest.mark.parametrize("cuda_graphs", [False, "eager"])
def test_multi_turn_chat_reuses_the_returned_cache(smollm2, cuda_graphs):
    """Turn 2 passes turn 1's returned cache with the re-rendered conversation: the same text as plain generate()
    doing the same, and only the new message is prefilled. ``"eager"``: both turns draft on fixed-shape level-1
    steps."""
    model, tokenizer = smollm2
    document = tokenizer.decode(tokenizer(python_reference_text()[:6000]).input_ids[:700])
    turns = [f"{document}\n\nUsing only the document above: what is a lexical analyzer?", "Say it in five words."]
    hf_triforce.enable(model)
    try:
        config = TriForceConfig(retrieval_budget=128, cuda_graphs=cuda_graphs)
        fast = _chat(model, tokenizer, turns, triforce_config=config)
        reused = hf_triforce.last_stats(model).reused_tokens
        speculated = hf_triforce.last_stats(model).level1.drafted  # turn 2 speculated, from the reused cache
        plain = _chat(model, tokenizer, turns)
    finally:
        hf_triforce.disable(model)
    assert fast.messages == plain.messages and torch.equal(fast.sequences, plain.sequences)
    assert fast.prefilled == plain.prefilled and fast.prefilled[1] < 60 < fast.prompts[1]
    assert reused == fast.prompts[1] - fast.prefilled[1]
    assert speculated > 0
    assert fast.cache.get_seq_length() == fast.sequences.shape[1] - 1
