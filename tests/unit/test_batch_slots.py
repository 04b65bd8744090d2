"""The batch's slot bookkeeping and masked attention against the plain computation they replace.

Attention over a batch with padding and holes must equal, row by row, attention over that row's real keys only
(gathered by hand); the slot masks must keep exactly what each row accepted.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_triforce.caches.slots import SlotMask, ViewSlots
from hf_triforce.kernels.attention import masked_gqa_attention

pytestmark = pytest.mark.unit


def reference_row(query, key, value, valid_row):
    """One row ``[H_q, q, D]``: causal attention of the last ``q`` slots over the real keys only (by hand)."""
    h_q, q_len = query.shape[0], query.shape[1]
    groups = h_q // key.shape[0]
    out = []
    for h in range(h_q):
        keys, values = key[h // groups], value[h // groups]
        valid = valid_row[h // groups] if valid_row.shape[0] > 1 else valid_row[0]
        rows = []
        for i in range(q_len):
            slot = key.shape[1] - q_len + i
            seen = valid.clone()
            seen[slot + 1 :] = False
            seen[slot] = True
            k, v = keys[seen], values[seen]
            weights = (query[h, i] @ k.T * query.shape[-1] ** -0.5).softmax(-1)
            rows.append(weights @ v)
        out.append(torch.stack(rows))
    return torch.stack(out).transpose(0, 1)  # [q, H_q, D]


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_attention_equals_attention_over_real_keys(per_head, q_len, dtype):
    torch.manual_seed(0)
    b, h_q, h_kv, length, d = 3, 6, 2, 40, 8
    query = torch.randn(b, h_q, q_len, d, dtype=dtype)
    key, value = torch.randn(b, h_kv, length, d, dtype=dtype), torch.randn(b, h_kv, length, d, dtype=dtype)
    valid = torch.rand(b, h_kv if per_head else 1, length) > 0.3
    valid[..., :2] = True
    out, _ = masked_gqa_attention(query, key, value, valid)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    for row in range(b):
        expected = reference_row(query[row], key[row], value[row], valid[row])
        torch.testing.assert_close(out[row], expected, atol=tolerance, rtol=tolerance)


def test_masked_attention_all_valid_is_causal_sdpa():
    torch.manual_seed(1)
    query, key = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    out, _ = masked_gqa_attention(query, key, key, torch.ones(2, 1, 5, dtype=torch.bool))
    expected = F.scaled_dot_product_attention(query, key, key, is_causal=True, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected)


def test_slot_mask_keeps_each_row_s_accepted_slots():
    slots = SlotMask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]]))
    assert slots.positions.tolist() == [2, 4, 3]
    positions = slots.append(4)
    assert positions[:, 0].tolist() == [2, 4, 3]
    crop = slots.keep(torch.tensor([1, 3, 2]), width=4)
    assert crop == -1  # no row kept the 4th slot
    assert slots.valid.int().tolist() == [[0, 0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 0]]
    assert slots.positions.tolist() == [3, 7, 5]  # each row's real tokens: nothing lost to the shortest
    slots.keep_rows(torch.tensor([0, 2]))
    assert slots.positions.tolist() == [3, 5]


def test_slot_mask_chunks():
    slots = SlotMask(torch.tensor([[0] * 9 + [1] * 7, [1] * 16]))
    assert slots.chunk_mask(4).tolist() == [[False, False, True, True], [True] * 4]
    assert slots.first_chunk(4).tolist() == [2, 0]


def test_view_slots_tail_is_shared_by_heads_and_layers():
    gathered = [torch.tensor([[[True, False], [True, True]]])]
    view = ViewSlots(gathered, torch.tensor([[True]]))
    view.append(3)
    assert view.keep(torch.tensor([2]), width=3) == -1
    assert view.for_layer(0).tolist() == [[[True, False, True, True, True], [True, True, True, True, True]]]


def test_selection_prefers_real_chunks_and_keeps_each_row_s_sink():
    """A row whose first 48 slots are padding: with room for them, only chunks of real tokens are selected (besides
    chunk 0), and the row's first real chunk is always among them."""
    from hf_triforce.caches.retrieval import RetrievalCache

    torch.manual_seed(0)
    cache = RetrievalCache(num_layers=1, chunk_size=8)
    cache.update(torch.randn(2, 2, 128, 16), torch.randn(2, 2, 128, 16), layer_idx=0)
    valid = torch.ones(2, 128, dtype=torch.bool)
    valid[0, :48] = False
    (indices,) = cache.select([torch.randn(2, 4, 16)], budget=64, recent_window=16, slots=SlotMask(valid))
    chunks = indices[0] // 8
    assert not ((chunks > 0) & (chunks < 6)).any()  # chunks 1-5 are padding only
    assert (chunks == 6).any(dim=-1).all()  # the row's first real chunk: its sink
