"""rope_matrices (level 1's direct forward rotates queries and keys with one product a layer) against transformers'
own ``apply_rotary_pos_emb`` over ``LlamaRotaryEmbedding``'s angles, and against ``apply_rope`` for partial rotary."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from hf_triforce.hf.model import apply_rope, rope_matrices

pytestmark = pytest.mark.unit


def _tolerance(dtype: torch.dtype) -> float:
    """Each output sums two rounded products (magnitudes below 4 here): a few units of the dtype's rounding."""
    return 16 * torch.finfo(dtype).eps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("positions", [[0, 1, 2], [7000, 7001, 7002, 7003], [5, 5, 5]])  # a tree's nodes share one
def test_equals_transformers_rotary(dtype, positions):
    config = LlamaConfig(hidden_size=128, num_attention_heads=2, rope_theta=10000.0)
    rotary = LlamaRotaryEmbedding(config)
    generator = torch.Generator().manual_seed(len(positions))
    q = torch.randn(len(positions), 5, 64, generator=generator).to(dtype)
    cos, sin = rotary(q, torch.tensor([positions]))  # [1, q, 64]
    got = torch.bmm(q, rope_matrices(cos[0], sin[0], 64))
    expected, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)
    torch.testing.assert_close(got, expected[0].transpose(0, 1), rtol=0, atol=_tolerance(dtype))


def test_partial_rotary_leaves_the_tail_as_it_is():
    generator = torch.Generator().manual_seed(0)
    x, angles = torch.randn(3, 4, 16, generator=generator), torch.rand(3, 4, generator=generator) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # 8 of the 16 channels
    got = torch.bmm(x, rope_matrices(cos, sin, 16))
    torch.testing.assert_close(got, apply_rope(x, cos[:, None], sin[:, None]), rtol=0, atol=_tolerance(torch.float32))
    assert torch.equal(got[..., 8:], x[..., 8:])
