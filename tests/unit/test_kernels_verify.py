"""The split-KV verification attention kernel (hf_triforce.kernels.verification) against its reference.

On the CPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1`` set per test, see
tests/unit/test_kernels_retrieval.py for why that works after Triton was imported). Tolerance, as
flash-attn tests do: the kernel's error against a float64 reference is at most twice the error of torch's
own attention in the input dtype, plus one rounding of the output to that dtype.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hf_triforce.kernels.verification import (  # noqa: E402
    merge_splits,
    verify_attention,
    verify_attention_reference,
    verify_attention_triton,
)

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("triton_mode")]


def _inputs(heads, kv_heads, q_len, kv_len, head_dim, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(1, heads, q_len, head_dim, generator=gen).to(device, dtype)
    # keys/values as prefixes of larger preallocated buffers, as the caches hold them
    key = torch.randn(1, kv_heads, kv_len + 9, head_dim, generator=gen).to(device, dtype)[:, :, :kv_len]
    value = torch.randn(1, kv_heads, kv_len + 9, head_dim, generator=gen).to(device, dtype)[:, :, :kv_len]
    return query, key, value


def _assert_close_to_float64(got, query, key, value):
    exact = verify_attention_reference(query.double(), key.double(), value.double())
    torch_err = (verify_attention_reference(query, key, value).double() - exact).abs().max()
    rounding = torch.finfo(query.dtype).eps * exact.abs().max()
    err = (got.double() - exact).abs().max()
    assert err <= 2 * torch_err + rounding + 1e-7, f"kernel error {err:.3g}, torch's {torch_err:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("q_len,kv_len,splits", [(1, 70, 2), (3, 100, 3), (7, 300, 4), (7, 7, 1), (8, 200, None)])
def test_matches_reference(dtype, heads, kv_heads, q_len, kv_len, splits):
    query, key, value = _inputs(heads, kv_heads, q_len, kv_len, 16, dtype)
    got = verify_attention_triton(query, key, value, splits=splits)
    assert got.shape == query.shape and got.dtype == dtype
    _assert_close_to_float64(got, query, key, value)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_head_dims_and_scale(head_dim):
    query, key, value = _inputs(8, 2, 5, 150, head_dim, torch.float32, seed=head_dim)
    got = verify_attention_triton(query, key, value, scale=0.3, splits=2)
    torch.testing.assert_close(got, verify_attention_reference(query, key, value, scale=0.3), rtol=1e-5, atol=1e-5)


def test_more_splits_than_keys_per_split():
    """Splits whose keys are all hidden from some rows (the last split holds only the newest tokens)."""
    query, key, value = _inputs(4, 2, 6, 70, 16, torch.float32)
    got = verify_attention_triton(query, key, value, splits=64)  # 2 splits of 64 keys; the second sees 6
    torch.testing.assert_close(got, verify_attention_reference(query, key, value), rtol=1e-5, atol=1e-5)


def test_merge_of_a_single_split_is_the_normalization():
    acc, m, s = torch.randn(1, 2, 1, 16, 8), torch.randn(1, 2, 1, 16), torch.rand(1, 2, 1, 16) + 0.5
    out = merge_splits(acc, m, s, group=2, q_len=3)
    expected = (acc[..., :6, :] / s[..., :6, None])[:, :, 0].reshape(1, 4, 3, 8)
    torch.testing.assert_close(out, expected)


def test_dispatch_on_the_cpu_is_the_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    query, key, value = _inputs(4, 2, 3, 50, 16, torch.float32)
    assert torch.equal(verify_attention(query, key, value), verify_attention_reference(query, key, value))


@pytest.mark.parametrize(
    "shapes,message",
    [
        (((1, 4, 3, 16), (1, 3, 50, 16)), "incompatible"),  # 4 query heads over 3 KV heads
        (((1, 4, 20, 16), (1, 2, 10, 16)), "incompatible"),  # more queries than keys
        (((4, 3, 16), (1, 2, 50, 16)), "expected query"),
        (((1, 4, 33, 16), (1, 2, 80, 16)), "at most 64 query rows"),  # a prefill chunk, not a verification
    ],
)
def test_bad_shapes(shapes, message):
    q_shape, k_shape = shapes
    with pytest.raises(ValueError, match=message):
        verify_attention_triton(torch.randn(q_shape), torch.randn(k_shape), torch.randn(k_shape))


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv_heads,kv_len", [(32, 32, 32768), (32, 8, 131072)])
def test_gpu_llama_shapes(heads, kv_heads, kv_len):
    query, key, value = _inputs(heads, kv_heads, 7, kv_len, 128, torch.bfloat16, device="cuda")
    _assert_close_to_float64(verify_attention(query, key, value), query, key, value)
