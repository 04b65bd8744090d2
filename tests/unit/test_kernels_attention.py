"""``gqa_sdpa_attention`` against the transformers computation it replaces (``sdpa_attention_forward``)."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hf_triforce.kernels.attention import _bottom_right_causal, gqa_sdpa_attention

pytestmark = pytest.mark.unit

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


class _Attention(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _inputs(q_len, kv_len, heads, kv_heads, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(1, heads, q_len, 16, generator=gen).to(dtype)
    # Keys/values as slices of a larger preallocated buffer, as the caches hold them.
    key = torch.randn(1, kv_heads, kv_len + 5, 16, generator=gen).to(dtype)[:, :, :kv_len]
    value = torch.randn(1, kv_heads, kv_len + 5, 16, generator=gen).to(dtype)[:, :, :kv_len]
    return query, key, value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 1), (4, 4)])
@pytest.mark.parametrize("q_len,kv_len", [(1, 50), (3, 50), (7, 300), (8, 8)])
@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_matches_transformers_sdpa(dtype, heads, kv_heads, q_len, kv_len, mask_kind):
    query, key, value = _inputs(q_len, kv_len, heads, kv_heads, dtype)
    mask = _bottom_right_causal(q_len, kv_len, query.device)
    if mask_kind == "float":
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    elif mask_kind == "none":
        if q_len not in (1, kv_len):
            pytest.skip("transformers never passes mask=None for 1 < q < L")
        mask = None
    module = _Attention(heads // kv_heads)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = gqa_sdpa_attention(module, query, key, value, mask, scaling=0.25)
    assert got.shape == expected.shape == (1, q_len, heads, 16)
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_matches_hand_computation():
    query, key, value = _inputs(4, 20, 6, 2, torch.float64)
    got, _ = gqa_sdpa_attention(None, query, key, value, None)
    mask = _bottom_right_causal(4, 20, query.device)[0, 0]
    expanded_k, expanded_v = key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1)
    scores = (query @ expanded_k.transpose(-1, -2)) / 4.0
    expected = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ expanded_v
    torch.testing.assert_close(got, expected.transpose(1, 2))


def test_bottom_right_causal_mask():
    mask = _bottom_right_causal(2, 4, torch.device("cpu"))[0, 0]
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_dropout_is_refused():
    query, key, value = _inputs(2, 5, 2, 1, torch.float32)
    with pytest.raises(ValueError, match="dropout"):
        gqa_sdpa_attention(None, query, key, value, None, dropout=0.1)


@pytest.mark.parametrize("mask_heads", [1, 9])
def test_batched_and_per_head_masks(mask_heads):
    """A mask shared by the heads takes the packed path, a per-head one SDPA's own GQA; both equal transformers'."""
    gen = torch.Generator().manual_seed(1)
    query, key = torch.randn(2, 9, 5, 16, generator=gen), torch.randn(2, 3, 40, 16, generator=gen)
    value = torch.randn(2, 3, 40, 16, generator=gen)
    mask = torch.rand(2, mask_heads, 5, 40, generator=gen) > 0.3
    mask[..., -5:] = _bottom_right_causal(5, 40, query.device)[..., -5:]
    mask[..., 0] = True  # no fully masked row
    expected, _ = sdpa_attention_forward(_Attention(3), query, key, value, mask, scaling=0.25)
    got, _ = gqa_sdpa_attention(None, query, key, value, mask, scaling=0.25)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
