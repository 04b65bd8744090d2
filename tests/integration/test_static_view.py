"""The fixed-capacity level-1 view (``StaticRetrievalView``) and its step runner, on the CPU (eager static steps).

References: attention by hand in float64 over the compacted keys (gathered tokens, then the step's own), and
the dynamic-shape :class:`RetrievalView` that level 1 uses by default, forward for forward, across drafts
rejected (crops), tokens appended to the full cache (sync) and a re-selection (refresh).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from transformers.models.llama.modeling_llama import repeat_kv

from hf_triforce import InternalError
from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.caches.static_view import StaticRetrievalView
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.hierarchy.static_steps import StaticStepRunner, static_causal_mask
from hf_triforce.kernels.retrieval import gather_tokens

pytestmark = pytest.mark.integration
logger = logging.getLogger(__name__)

KV_HEADS, Q_HEADS, HEAD_DIM = 2, 4, 16
TOLERANCE = 1e-5  # float32; measured max |diff| of the logits is ~3e-6 (see test_forward_matches_dynamic_view)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_selection(length: int, selected: int, seed: int, kv_heads: int = KV_HEADS) -> torch.Tensor:
    """``[1, H_kv, selected]`` sorted token indices, a different random subset per KV head."""
    gen = _gen(seed)
    rows = [torch.randperm(length, generator=gen)[:selected].sort().values for _ in range(kv_heads)]
    return torch.stack(rows)[None]


def _attention_by_hand(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """float64 causal attention of ``q`` queries ``[1, H_q, q, D]`` placed after all but the last ``q`` of the keys."""
    q, n = query.shape[2], keys.shape[2]
    k, v = (repeat_kv(t.double(), Q_HEADS // KV_HEADS) for t in (keys, values))
    scores = query.double() @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    hidden = torch.arange(n)[None, :] > (n - q + torch.arange(q))[:, None]
    return scores.masked_fill(hidden, float("-inf")).softmax(-1) @ v


def _step_attention(view: StaticRetrievalView, query, key_states, value_states, kind: str) -> torch.Tensor:
    """Write a step into ``view`` layer 0 and attend over the whole fixed-capacity storage with the static mask."""
    q, start = key_states.shape[2], view.visible_length
    slots = torch.arange(start, start + q)
    view.slots.positions = slots
    keys, values = view.layers[0].update(key_states, value_states)
    assert keys.shape[2] == view.capacity  # a constant shape, whatever the step
    mask = static_causal_mask(slots, torch.arange(view.capacity), kind, torch.float32)
    k, v = (repeat_kv(t, Q_HEADS // KV_HEADS) for t in (keys, values))
    if kind == "bool":
        out = torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask)
    else:
        out = (query @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) + mask).softmax(-1) @ v
    view.layers[0].advance(q)
    return out


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_static_layer_attention_equals_compacted_attention_by_hand(kind):
    gen = _gen(0)
    source = RetrievalCache(num_layers=1, chunk_size=8, capacity=64)
    full_k, full_v = (torch.randn(1, KV_HEADS, 50, HEAD_DIM, generator=gen) for _ in range(2))
    source.update(full_k, full_v, layer_idx=0)
    indices = _random_selection(50, 20, seed=1)
    view = StaticRetrievalView(source, capacity=32)
    view.refresh([indices])
    gathered_k, gathered_v = gather_tokens(full_k, indices), gather_tokens(full_v, indices)

    # A 3-token step after the 20 gathered tokens: the slots after it hold zeros and must be invisible.
    new_k, new_v = (torch.randn(1, KV_HEADS, 3, HEAD_DIM, generator=gen) for _ in range(2))
    query = torch.randn(1, Q_HEADS, 3, HEAD_DIM, generator=gen)
    got = _step_attention(view, query, new_k, new_v, kind)
    expected = _attention_by_hand(query, torch.cat([gathered_k, new_k], 2), torch.cat([gathered_v, new_v], 2))
    torch.testing.assert_close(got.double(), expected, atol=TOLERANCE, rtol=TOLERANCE)

    # Reject the last two drafts: their slots keep stale states, which the next step overwrites or hides.
    view.crop(-2)
    kept_k, kept_v = new_k[:, :, :1], new_v[:, :, :1]
    new_k, new_v = (torch.randn(1, KV_HEADS, 1, HEAD_DIM, generator=gen) for _ in range(2))
    query = torch.randn(1, Q_HEADS, 1, HEAD_DIM, generator=gen)
    got = _step_attention(view, query, new_k, new_v, kind)
    keys = torch.cat([gathered_k, kept_k, new_k], 2)
    expected = _attention_by_hand(query, keys, torch.cat([gathered_v, kept_v, new_v], 2))
    torch.testing.assert_close(got.double(), expected, atol=TOLERANCE, rtol=TOLERANCE)


def _forward(model, cache, tokens: torch.Tensor, position: int) -> torch.Tensor:
    """Dynamic-shape forward (as level 1 runs today): float32 logits ``[q, V]``."""
    q = tokens.shape[0]
    positions = torch.arange(position, position + q)[None]
    out = model(input_ids=tokens[None], position_ids=positions, **cache_kwargs(cache), use_cache=True, logits_to_keep=q)
    return out.logits[0].float()


class _Pair:
    """A dynamic RetrievalView and a StaticRetrievalView over the same full cache, stepped in lockstep."""

    def __init__(self, model, source: RetrievalCache, indices: list[torch.Tensor], extra: int, budget: int) -> None:
        self.model, self.source, self.extra = model, source, extra
        self.dynamic = source.sparse_view(indices, extra)
        self.static = StaticRetrievalView(source, budget + extra)
        self.static.refresh(indices)
        self.runner = StaticStepRunner(model, self.static, graph_widths=range(1, 4), use_graphs=True)
        self.position = source.get_seq_length()
        self.max_diff = 0.0

    def step(self, tokens: torch.Tensor, keep: int) -> None:
        """One level-1 step of ``tokens``, then keep the first ``keep`` (reject the rest)."""
        expected = _forward(self.model, self.dynamic, tokens, self.position)
        got = self.runner.step(tokens, self.position)
        self.max_diff = max(self.max_diff, float((got - expected).abs().max()))
        torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=TOLERANCE)
        for view in (self.dynamic, self.static):
            view.crop(-(tokens.shape[0] - keep))
        self.position += keep
        assert self.static.visible_length == self.dynamic.visible_length
        assert self.static.get_seq_length() == self.dynamic.get_seq_length() == self.position

    def verify(self, tokens: torch.Tensor) -> None:
        """The full cache takes ``tokens`` (as after a level-2 verification); both views sync to it."""
        start = self.source.get_seq_length()
        _forward(self.model, self.source, tokens, start)
        for view in (self.dynamic, self.static):
            view.sync()
        self.position = self.source.get_seq_length()

    def refresh(self, indices: list[torch.Tensor]) -> None:
        self.dynamic = self.source.sparse_view(indices, self.extra)
        self.static.refresh(indices)
        self.position = self.source.get_seq_length()


@pytest.mark.parametrize("family", ["llama_gqa", "qwen2"])
def test_forward_matches_dynamic_view(zoo, family):
    model = zoo.target(family)
    num_layers, budget, extra = model.config.num_hidden_layers, 48, 24
    gen = _gen(7)
    tokens = torch.randint(0, model.config.vocab_size, (200,), generator=gen)
    source = RetrievalCache(num_layers, chunk_size=8, capacity=256)
    with torch.no_grad():
        _forward(model, source, tokens[:100], 0)
        pair = _Pair(model, source, [_random_selection(100, budget, seed=s) for s in range(num_layers)], extra, budget)
        draft = iter(tokens[100:])

        def take(n: int) -> torch.Tensor:
            return torch.stack([next(draft) for _ in range(n)])

        for width, keep in [(3, 1), (1, 1), (2, 2), (3, 3), (2, 1)]:  # rejected drafts are cropped
            pair.step(take(width), keep)
        pair.verify(take(5))
        for width, keep in [(1, 1), (3, 2), (2, 1)]:
            pair.step(take(width), keep)
        pair.verify(take(4))
        pair.refresh([_random_selection(source.get_seq_length(), budget, seed=10 + s) for s in range(num_layers)])
        for width, keep in [(3, 1), (1, 1), (3, 3), (2, 2)]:
            pair.step(take(width), keep)
    assert pair.runner.counts == {"eager": 12, "replay": 0, "capture": 0}  # no CUDA: graphs are never used
    logger.info("%s: max |static - dynamic| logit difference over 12 steps = %.3g", family, pair.max_diff)


def test_runner_refuses_to_overflow_the_view(zoo):
    model = zoo.target("llama_gqa")
    source = RetrievalCache(model.config.num_hidden_layers, chunk_size=8, capacity=64)
    with torch.no_grad():
        _forward(model, source, torch.arange(30), 0)
        view = StaticRetrievalView(source, capacity=32)
        view.refresh([torch.arange(30).expand(1, KV_HEADS, 30)] * model.config.num_hidden_layers)
        runner = StaticStepRunner(model, view)
        runner.step(torch.tensor([1, 2]), 30)
        with pytest.raises(InternalError, match="overflows the static cache"):
            runner.step(torch.tensor([3]), 32)


@pytest.mark.parametrize("strict", [False, True])
def test_failed_capture_falls_back_to_eager_unless_strict(zoo, monkeypatch, caplog, strict):
    """The fallback logic of a capture that fails (a capture-unsafe op in the forward), with the capture mocked."""
    model = zoo.target("llama_gqa")
    source = RetrievalCache(model.config.num_hidden_layers, chunk_size=8, capacity=64)
    with torch.no_grad():
        _forward(model, source, torch.arange(30), 0)
        view = StaticRetrievalView(source, capacity=40)
        view.refresh([torch.arange(30).expand(1, KV_HEADS, 30)] * model.config.num_hidden_layers)
        runner = StaticStepRunner(model, view, graph_widths=[1], strict=strict)
        runner.use_graphs = True  # as on CUDA

        def failing_capture(q, inputs):
            raise RuntimeError("operation not permitted when stream is capturing")

        monkeypatch.setattr(runner, "_capture", failing_capture)
        if strict:
            with pytest.raises(RuntimeError, match="stream is capturing"):
                runner.step(torch.tensor([7]), 30)
            return
        logits = runner.step(torch.tensor([7]), 30)
        everything = [torch.arange(30).expand(1, KV_HEADS, 30)] * model.config.num_hidden_layers
        expected = _forward(model, source.sparse_view(everything, 8), torch.tensor([7]), 30)
    torch.testing.assert_close(logits, expected, atol=TOLERANCE, rtol=TOLERANCE)
    assert not runner.use_graphs and runner.counts["eager"] == 1 and view.visible_length == 31
    assert "running these steps eagerly" in caplog.text


def test_static_layer_needs_slots():
    source = RetrievalCache(num_layers=1, chunk_size=8, capacity=16)
    source.update(torch.randn(1, KV_HEADS, 8, HEAD_DIM), torch.randn(1, KV_HEADS, 8, HEAD_DIM), layer_idx=0)
    view = StaticRetrievalView(source, capacity=16)
    view.refresh([torch.arange(8).expand(1, KV_HEADS, 8)])
    with pytest.raises(InternalError, match="outside a StaticStepRunner step"):
        view.update(torch.randn(1, KV_HEADS, 1, HEAD_DIM), torch.randn(1, KV_HEADS, 1, HEAD_DIM), layer_idx=0)
