"""Options a batch (several rows, or one left-padded row) serves since one loop runs every call.

Each case checks greedy output against plain ``generate()`` given the same inputs, and from the call's own
statistics that level 1 drafted (and was rejected, over a sparse view). What a batch still refuses is in
``test_batches.py::test_batch_refusals``; the sampling side of batches from reused caches is in
``test_sampling_paths.py``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache
from transformers.generation.streamers import BaseStreamer

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.hf.versions import CACHE_ARG, cache_kwargs
from hf_triforce.kernels.int4_linear import int4_kernel_available
from tests.integration.test_batches import SPARSE, check_rows, left_padded

pytestmark = pytest.mark.integration


class Collector(BaseStreamer):
    """Every tensor ``generate()`` puts, flattened, in order."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        assert value.dim() == 1 or value.shape[0] == 1, "a streamer takes one row"
        self.tokens += value.reshape(-1).tolist()

    def end(self) -> None:
        self.ended = True


def padded_row(length: int = 150, pad: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = left_padded([length + pad, length], repeat=True)
    return ids[1:], mask[1:]


@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_a_padded_row_streams_what_plain_generate_streams(model_factory, assert_ran, drafter):
    """One left-padded row with a streamer: the same tokens, streamed in the same order (prompt, then each new
    token), as plain ``generate()`` streams them."""
    model = model_factory("llama_gqa", num_layers=2)
    ids, mask = padded_row()
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    plain, ours = Collector(), Collector()
    expected = model.generate(ids, streamer=plain, **kwargs)
    got = model.generate(ids, streamer=ours, triforce_config=TriForceConfig(drafter=drafter, **SPARSE), **kwargs)
    check_rows(expected, got)
    assert ours.tokens == plain.tokens == expected[0].tolist() and ours.ended
    assert hf_triforce.last_stats(model).rows  # the batched form of the call: per-row statistics
    assert_ran(model, rejected=("level1",))


def test_a_padded_row_returns_its_scores(model_factory, assert_ran):
    """One left-padded row with ``output_scores``/``output_logits``: one ``[1, V]`` entry per new token, whose argmax
    is the token chosen, close to plain ``generate()``'s (multi-token forwards round differently in float32)."""
    model = model_factory("llama_gqa", num_layers=2)
    ids, mask = padded_row()
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
                  output_scores=True, output_logits=True)  # fmt: skip
    expected = model.generate(ids, **kwargs)
    got = model.generate(ids, triforce_config=TriForceConfig(**SPARSE), **kwargs)
    check_rows(expected.sequences, got.sequences)
    new = got.sequences[0, ids.shape[1] :]
    assert len(got.scores) == len(got.logits) == new.shape[0]
    assert torch.equal(torch.cat(got.scores).argmax(-1), new)
    torch.testing.assert_close(torch.cat(got.scores), torch.cat(expected.scores), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(got.logits), torch.cat(expected.logits), atol=1e-4, rtol=1e-4)
    assert_ran(model, rejected=("level1",))


def prefilled(model, ids: torch.Tensor, mask: torch.Tensor) -> DynamicCache:
    """A ``DynamicCache`` of ``ids`` ``[B, n]`` (positions from ``mask``, as plain ``generate()`` numbers them)."""
    cache = DynamicCache()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache_kwargs(cache))
    return cache


def continued(ids: torch.Tensor, mask: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` followed by a continuation of ``lengths[b]`` tokens per row, padded in the middle (before each row's
    continuation) to a common width: the layout of a batch whose prefixes were cached before its questions."""
    width = max(lengths)
    rows, masks = [], []
    for b, n in enumerate(lengths):
        tokens = torch.randint(1, 50, (n,), generator=torch.Generator().manual_seed(100 + b))
        rows.append(torch.cat([ids[b], tokens.new_zeros(width - n), tokens]))
        masks.append(torch.cat([mask[b], mask.new_zeros(width - n), mask.new_ones(n)]))
    return torch.stack(rows), torch.stack(masks)


@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_a_batch_continues_per_row_cached_prefixes(model_factory, assert_ran, drafter):
    """A cache prefilled with two left-padded prefixes (one row each), continued by questions of different lengths:
    every row equals plain batched ``generate()`` from a copy of the same cache, and the caller's cache is left as
    it was (the output carries none)."""
    model = model_factory("llama_gqa", num_layers=2)
    prefix, prefix_mask = left_padded([220, 160], repeat=True)
    cache = prefilled(model, prefix, prefix_mask)
    ids, mask = continued(prefix, prefix_mask, [12, 5])
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **{CACHE_ARG: copy.deepcopy(cache)}, **kwargs)
    before = [layer.keys.clone() for layer in cache.layers]
    cfg = TriForceConfig(drafter=drafter, **SPARSE)
    out = model.generate(ids, triforce_config=cfg, return_dict_in_generate=True, **{CACHE_ARG: cache}, **kwargs)
    check_rows(expected, out.sequences)
    assert getattr(out, CACHE_ARG) is None
    assert all(torch.equal(layer.keys, keys) for layer, keys in zip(cache.layers, before, strict=True))
    stats = hf_triforce.last_stats(model)
    assert stats.reused_tokens == prefix.shape[1]
    for row in stats.rows:
        assert_ran(row, rejected=("level1",))


def test_a_batch_continues_a_shared_prefix(model_factory, assert_ran):
    """A one-row cache of a prefix every row shares, continued by two questions of different lengths: every row equals
    plain batched ``generate()`` from that cache copied into each row."""
    model = model_factory("llama_gqa", num_layers=2)
    prefix, prefix_mask = left_padded([240], repeat=True)
    cache = prefilled(model, prefix, prefix_mask)
    ids, mask = continued(prefix.expand(2, -1), prefix_mask.expand(2, -1), [9, 3])
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    per_row = copy.deepcopy(cache)
    per_row.batch_repeat_interleave(2)
    expected = model.generate(ids, **{CACHE_ARG: per_row}, **kwargs)
    got = model.generate(ids, triforce_config=TriForceConfig(drafter="ngram", **SPARSE), **{CACHE_ARG: cache},
                         **kwargs)  # fmt: skip
    check_rows(expected, got)
    for row in hf_triforce.last_stats(model).rows:
        assert_ran(row, rejected=("level1",))


def test_middle_padding_without_a_cache(model_factory, assert_ran):
    """Padding before each row's question (not only on the left) is what the mask says, as in plain ``generate()``."""
    model = model_factory("llama_gqa", num_layers=2)
    prefix, prefix_mask = left_padded([200, 150], repeat=True)
    ids, mask = continued(prefix, prefix_mask, [10, 2])
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    check_rows(model.generate(ids, **kwargs), model.generate(ids, triforce_config=TriForceConfig(**SPARSE), **kwargs))
    assert_ran(model, rejected=("level1",))


@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_a_batch_on_fixed_shapes(model_factory, assert_ran, runners, drafter):
    """``cuda_graphs="eager"``: level 1's fixed-shape steps (what CUDA graphs replay, run eagerly on the CPU) serve a
    batch, each row masked by its slots in fixed-capacity storage; every row equals plain batched ``generate()``,
    rows stopping early included (the fixed-shape storage is rebuilt for the rows that remain)."""
    model = model_factory("llama_gqa", num_layers=2)
    draft = model_factory("llama_gqa", num_layers=1, seed=3, enable=False)
    ids, mask = left_padded([240, 170, 200], repeat=drafter != "none")
    kwargs = dict(attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0)
    eos = int(model.generate(ids, **kwargs)[1, ids.shape[1] + 12])  # row 1 stops by token 13 at the latest
    expected = model.generate(ids, eos_token_id=eos, **kwargs)
    cfg = TriForceConfig(drafter=drafter, cuda_graphs="eager", draft_cache_budget=48, **SPARSE)
    assistant = {"assistant_model": draft} if drafter == "model" else {}
    got = model.generate(ids, eos_token_id=eos, triforce_config=cfg, **assistant, **kwargs)
    check_rows(expected, got)
    stats = hf_triforce.last_stats(model)
    assert min(row.new_tokens for row in stats.rows) < 40  # a row left the batch before the others
    level1 = [r for r in runners if r.slot_validity is not None]
    assert len(level1) >= 2 and all(r.counts["eager"] > 0 for r in level1)  # rebuilt when the row left
    assert {r.cache.layers[0].buffer.storage[0].shape[0] for r in level1} >= {3, 2}
    levels = ("level1",) if drafter == "none" else ("level0", "level1")
    assert_ran(model, drafted=levels, rejected=("level1",))


@pytest.mark.skipif(not int4_kernel_available(), reason="this torch has no int4 CPU kernel")
@pytest.mark.parametrize("rows, steps", [(1, "eager"), (2, False), (2, "eager")])
def test_int4_level1_weights_through_transformers_forward(model_factory, assert_ran, rows, steps):
    """``level1_weights="int4"`` where level 1 runs transformers' forward (fixed-shape steps, a batch): the int4 copy
    of the projections drafts, the output stays plain ``generate()``'s."""
    model = model_factory("llama_gqa", num_layers=2)
    ids, mask = left_padded([230, 190][:rows], repeat=True)
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    cfg = TriForceConfig(drafter="ngram", level1_weights="int4", cuda_graphs=steps, **SPARSE)
    check_rows(model.generate(ids, **kwargs), model.generate(ids, triforce_config=cfg, **kwargs))
    stats = hf_triforce.last_stats(model)
    assert (stats.level1_weights, stats.level1_forward) == ("int4", "transformers")
    assert_ran(model, rejected=("level1",))
