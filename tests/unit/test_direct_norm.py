"""Level 1's direct forward normalizes with ``Norm`` (four operations, the result written in the next product's
dtype) instead of ``F.rms_norm`` and a cast: it must equal transformers' own ``LlamaRMSNorm`` up to rounding."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from hf_triforce.hf.direct_forward import Norm

pytestmark = pytest.mark.unit


def _norm_module(size: int, eps: float, dtype: torch.dtype, seed: int) -> LlamaRMSNorm:
    module = LlamaRMSNorm(size, eps=eps)
    with torch.no_grad():
        module.weight.copy_(torch.rand(size, generator=torch.Generator().manual_seed(seed)) * 2 + 0.1)
    return module.to(dtype)


@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.1])
@pytest.mark.parametrize("rows", [1, 3, 24])
def test_float_input_equals_llama_rms_norm(out_dtype, eps, rows):
    module = _norm_module(576, eps, torch.float32, rows)
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(7)) * 30
    got = Norm.of(module)(x, out_dtype)
    expected = module(x)
    assert got.dtype == (out_dtype or torch.float32)
    # float32: a few units of rounding over a norm of 576 squares; bfloat16: the output's own rounding.
    atol = 4 * torch.finfo(got.dtype).eps * expected.abs().max().item()
    torch.testing.assert_close(got.float(), expected, rtol=torch.finfo(got.dtype).eps, atol=atol)


def test_small_rows_keep_eps():
    """Where ``eps`` dominates (tiny inputs), the result follows it as Llama's does (not ``x / |x|``)."""
    module = _norm_module(64, 1e-2, torch.float32, 0)
    x = torch.full((2, 64), 1e-3)
    torch.testing.assert_close(Norm.of(module)(x), module(x), rtol=1e-6, atol=1e-7)


def test_bfloat16_input_is_llama_arithmetic():
    module = _norm_module(64, 1e-6, torch.bfloat16, 1)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert torch.equal(Norm.of(module)(x), module(x))


def test_none_module_is_none():
    assert Norm.of(None) is None
