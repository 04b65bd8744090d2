"""A sliding layer of the full cache answers as transformers' ``DynamicSlidingWindowLayer`` and keeps only its window
(and a round until the round's crop); its readers go through its own positions."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.caches.sliding import SlidingLayer
from hf_triforce.caches.slots import CacheSlots, SlotMask

WINDOW = 8


def states(n: int, start: int = 0, rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, 2, n, 4]`` keys whose first feature is their position (values: minus it)."""
    keys = torch.zeros(rows, 2, n, 4)
    keys[..., 0] = torch.arange(start, start + n, dtype=torch.float32)
    return keys, -keys


def test_answers_as_transformers_sliding_layer_outside_rounds():
    ours, theirs = SlidingLayer(WINDOW, round_slots=4), DynamicSlidingWindowLayer(WINDOW)
    position = 0
    for n in (20, 1, 1, 3, 1):
        k, v = states(n, position)
        assert ours.get_mask_sizes(n) == theirs.get_mask_sizes(n)
        got, expected = ours.update(k, v), theirs.update(k, v)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        assert ours.get_seq_length() == theirs.get_seq_length()
        assert torch.equal(ours.keys, theirs.keys)
        position += n
    assert ours.buffer.nbytes() == 2 * 2 * (WINDOW - 1 + 4) * 4 * 4  # never grew past window - 1 + round_slots


def test_a_round_is_kept_until_its_crop_then_trimmed():
    layer = SlidingLayer(WINDOW, round_slots=4)
    layer.update(*states(30))
    layer.activate_past_recording()
    keys, _ = layer.update(*states(4, 30))
    assert keys.shape[2] == WINDOW - 1 + 4 and layer.get_mask_sizes(0) == (WINDOW - 1 + 4, 23)
    layer.crop(-2)  # two rejected
    layer.trim(layer.get_seq_length() - (WINDOW - 1))
    assert layer.start == 25 and layer.keys[0, 0, :, 0].tolist() == list(range(25, 32))


def test_a_cache_of_both_kinds_selects_the_window_of_its_sliding_layers():
    cache = RetrievalCache(num_layers=2, chunk_size=4, capacity=64, windows=[WINDOW, None], round_slots=4)
    for i in range(2):
        cache.update(*states(40), layer_idx=i)
    assert cache.is_sliding == [True, False]
    assert cache.layers[0].buffer.length == WINDOW - 1 and cache.layers[1].buffer.length == 40
    assert len(cache.summaries.layers) == 1  # chunk means of the full layer only
    queries = [torch.randn(1, 4, 4) for _ in range(2)]
    indices = cache.select(queries, budget=16, recent_window=4)
    assert indices[0][0, 0].tolist() == list(range(33, 40))  # the window it holds, at their positions
    assert indices[1].shape[-1] <= 16
    view = cache.sparse_view(indices, extra_capacity=4)
    assert view.layers[0].is_sliding and view.get_mask_sizes(1, 0) == (WINDOW, 33)
    assert view.get_query_offset(0) == 40 and view.get_seq_length(0) == 40
    assert view.layers[0].buffer.keys[0, 0, :, 0].tolist() == list(range(33, 40))


def test_a_view_selected_again_in_its_storage_equals_a_new_view():
    cache = RetrievalCache(num_layers=2, chunk_size=4, capacity=64, windows=[WINDOW, None], round_slots=4)
    for i in range(2):
        cache.update(*states(40), layer_idx=i)
    view = cache.sparse_view(cache.select([torch.randn(1, 4, 4) for _ in range(2)], 16, 4), extra_capacity=8)
    storage = [layer.buffer.storage[0].data_ptr() for layer in view.layers]
    for i in range(2):
        cache.update(*states(6, 40), layer_idx=i)
    cache.trim()
    indices = cache.select([torch.randn(1, 4, 4) for _ in range(2)], 16, 4)
    view.refresh(indices)
    fresh = cache.sparse_view(indices, extra_capacity=8)
    assert [layer.buffer.storage[0].data_ptr() for layer in view.layers] == storage  # no new memory
    assert view.get_seq_length() == fresh.get_seq_length() == 46
    for kept, new in zip(view.layers, fresh.layers, strict=True):
        assert (kept.start, kept.static_length) == (new.start, new.static_length)
        assert torch.equal(kept.buffer.keys, new.buffer.keys) and torch.equal(kept.buffer.values, new.buffer.values)
    assert view.layers[0].start == 46 - (WINDOW - 1)  # the sliding layer's window moved with the cache


def test_a_view_is_selected_again_once_the_window_moved_past_it():
    cache = RetrievalCache(num_layers=1, chunk_size=4, windows=[WINDOW], round_slots=4)
    cache.update(*states(20), layer_idx=0)
    view = cache.sparse_view(cache.select([torch.randn(1, 4, 4)], 16, 4), extra_capacity=8)
    cache.record_rounds(True)
    cache.update(*states(2, 20), layer_idx=0)
    cache.trim()
    assert view.tail_length() == 2
    view.sync()
    assert view.layers[0].buffer.keys[0, 0, :, 0].tolist() == list(range(13, 22))
    cache.update(*states(6, 22), layer_idx=0)
    cache.trim()  # the window starts at 21 now: the view's selection point (20) is gone
    assert view.tail_length() is None


def test_a_batch_packs_each_row_s_last_tokens():
    cache = RetrievalCache(num_layers=1, chunk_size=4, windows=[4], round_slots=3)
    cache.update(*states(6, rows=2), layer_idx=0)
    slots = SlotMask(torch.ones(2, 6, dtype=torch.bool))
    cache.record_rounds(True)
    cache.update(*states(3, 6, rows=2), layer_idx=0)
    slots.append(3)
    cache.crop(slots.keep(torch.tensor([1, 3]), width=3))
    cache.trim(slots)  # row 0 kept one of the round's 3 slots: two holes, not kept
    layer = cache.layers[0]
    assert layer.buffer.length == 3 and layer.get_seq_length() == slots.length == 9
    assert layer.buffer.keys[:, 0, :, 0].tolist() == [[4.0, 5.0, 6.0], [6.0, 7.0, 8.0]]
    assert layer.index(slots).tolist() == [[4, 5, 6], [6, 7, 8]]


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_s_sliding_layer_attends_as_its_full_cache_with_a_window(seed):
    """Rounds of random widths and uneven acceptance over two rows (padded): after every round the sliding
    layer holds at most ``window - 1`` slots, and every query of the next round sees exactly the keys a full layer
    (holes kept) shows it through the window, by its validity and window mask."""
    gen = torch.Generator().manual_seed(seed)
    window, rows = 5, 2
    cache = RetrievalCache(num_layers=2, chunk_size=4, windows=[None, window], round_slots=6)
    valid = torch.ones(rows, 7, dtype=torch.bool)
    valid[1, :3] = False  # left padding
    valid[0, 4] = False  # padding inside the prompt (a pad id there, and no attention mask): its window counts it
    slots = SlotMask(valid)
    for layer in range(2):
        cache.update(*states(7, rows=rows), layer_idx=layer)
    cache.trim(slots)
    cache.record_rounds(True)
    next_id = 7
    for _ in range(12):
        width = int(torch.randint(1, 6, (1,), generator=gen))
        slots.append(width)
        for layer in range(2):
            cache.update(*states(width, next_id, rows=rows), layer_idx=layer)
        assert cache.layers[1].buffer.length <= window - 1 + width
        masks = CacheSlots(slots, cache)
        assert _visible(cache, masks, 0, window, width) == _visible(cache, masks, 1, window, width)
        next_id += width
        kept = torch.randint(1, width + 1, (rows,), generator=gen)
        cache.crop(slots.keep(kept, width))
        cache.trim(slots)
        assert cache.layers[1].buffer.length <= window - 1


def _visible(cache, slots, layer_idx: int, window: int, q: int) -> list[list[set[float]]]:
    """Per row and query, the ids of the keys it sees in layer ``layer_idx`` (valid and within the window)."""
    mask = slots.for_layer(layer_idx)[:, :, None, :].expand(-1, -1, q, -1)
    in_window = slots.in_window(layer_idx, window, q)  # None: every key is within the window
    mask = mask if in_window is None else mask & in_window
    keys = cache.layers[layer_idx].buffer.keys[:, 0, :, 0]
    return [[set(keys[b][mask[b, 0, i]].tolist()) for i in range(q)] for b in range(keys.shape[0])]
