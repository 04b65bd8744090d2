"""TriForce through transformers' own convention for decoding methods, without ``hf_triforce.enable``:
``generate(custom_generate=hf_triforce.triforce_generate, triforce_config=...)`` (a callable) and
``generate(custom_generate=hf_triforce.CUSTOM_GENERATE_DIR, trust_remote_code=True, ...)`` (a directory laid out as a
Hub repository's ``custom_generate/generate.py``). Each must give plain ``generate()``'s greedy tokens and run the
levels it names."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

import hf_triforce
from hf_triforce import CUSTOM_GENERATE_DIR, TriForceConfig, UnsupportedGenerationError, triforce_generate
from tests.integration.conftest import build_model

pytestmark = pytest.mark.integration

CFG = dict(retrieval_budget=64, recent_window=16, chunk_size=8, gamma1=2, gamma2=4, adaptive=False,
           draft_cache_budget=48)  # fmt: skip


@pytest.fixture(scope="module")
def plain_model():
    """A tiny Llama that :func:`hf_triforce.enable` was never called on."""
    return build_model("llama_gqa", num_layers=2, seed=21, enable=False)


class Collector(BaseStreamer):
    def __init__(self) -> None:
        self.tokens: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        self.tokens += value.reshape(-1).tolist()

    def end(self) -> None:
        pass


@pytest.mark.parametrize("drafter", ["ngram", "draft_model", "assistant_model"])
def test_the_callable_runs_triforce_without_enable(plain_model, llama_draft, make_prompt, assert_ran, drafter):
    """The callable form; the draft model as ``draft_model=`` or as ``generate()``'s own ``assistant_model=`` (which
    transformers does not pass to a callable: TriForce reads it off the running ``generate()`` call)."""
    prompt = make_prompt(180, seed=5, repetitive=drafter == "ngram")
    expected = plain_model.generate(prompt, max_new_tokens=32, do_sample=False)
    draft = {} if drafter == "ngram" else {drafter: llama_draft}
    got = plain_model.generate(
        prompt, custom_generate=triforce_generate, triforce_config=TriForceConfig(**CFG),
        max_new_tokens=32, do_sample=False, **draft,
    )  # fmt: skip
    assert torch.equal(expected, got)
    assert not hf_triforce.is_enabled(plain_model)
    assert_ran(plain_model, drafted=("level0", "level1"), rejected=("level1",))


def test_the_callable_streams(plain_model, make_prompt, assert_ran):
    """A streamer given to ``generate()`` reaches the callable's decoding (read off the running call)."""
    prompt = make_prompt(150, seed=8)
    plain_stream, ours = Collector(), Collector()
    plain_model.generate(prompt, max_new_tokens=20, do_sample=False, streamer=plain_stream)
    plain_model.generate(prompt, custom_generate=triforce_generate, triforce_config=TriForceConfig(**CFG),
                         max_new_tokens=20, do_sample=False, streamer=ours)  # fmt: skip
    assert ours.tokens == plain_stream.tokens
    assert_ran(plain_model)


def test_the_directory_runs_triforce_with_every_generate_argument(plain_model, llama_draft, make_prompt, assert_ran):
    """The directory form gets ``generate()``'s own arguments: a streamer and ``assistant_model`` work."""
    prompt = make_prompt(180, seed=6)
    plain_stream, ours = Collector(), Collector()
    expected = plain_model.generate(prompt, max_new_tokens=32, do_sample=False, streamer=plain_stream)
    got = plain_model.generate(
        prompt, custom_generate=CUSTOM_GENERATE_DIR, trust_remote_code=True, assistant_model=llama_draft,
        triforce_config=TriForceConfig(**CFG), max_new_tokens=32, do_sample=False, streamer=ours,
    )  # fmt: skip
    assert torch.equal(expected, got)
    assert ours.tokens == plain_stream.tokens
    assert_ran(plain_model, drafted=("level0", "level1"), rejected=("level1",))


def test_a_default_config_and_a_batch(plain_model, assert_ran):
    """No ``triforce_config``: ``TriForceConfig()``'s defaults; a left-padded batch runs the same loop."""
    ids = torch.randint(1, 200, (2, 120), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :30] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    expected = plain_model.generate(ids, **kwargs)
    got = plain_model.generate(ids, custom_generate=triforce_generate, **kwargs)
    assert torch.equal(expected, got)
    assert hf_triforce.last_stats(plain_model).rows


def test_triforce_config_and_another_decoding_method_are_refused(llama, make_prompt, forward_counter):
    """``triforce_config`` on an enabled model with someone else's ``custom_generate``: one of the two would be
    ignored, so the call is refused before any forward."""
    counter = forward_counter(llama)
    with pytest.raises(UnsupportedGenerationError, match="Pass triforce_config or custom_generate, not both"):
        llama.generate(make_prompt(40), custom_generate=lambda *a, **k: None, triforce_config=TriForceConfig(),
                       max_new_tokens=4)  # fmt: skip
    counter.remove()
    assert counter.calls == 0
