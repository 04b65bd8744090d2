"""The CPU verification attention in key ranges (hf_triforce.kernels.verify_cpu) against its reference.

Tolerance, as the split-KV kernel's tests: the error against a float64 reference is at most twice the error of
torch's own attention in the input dtype, plus one rounding of the output to that dtype.
"""

from __future__ import annotations

import pytest
import torch

from hf_triforce.kernels.verification import verify_attention, verify_attention_reference
from hf_triforce.kernels.verify_cpu import MIN_PART_KEYS, cpu_kernel_available, cpu_key_parts, verify_attention_cpu

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not cpu_kernel_available(), reason="this torch has no CPU SDPA with its log-sum-exp"),
]


def _inputs(heads, kv_heads, q_len, kv_len, head_dim, dtype, seed=0, offset=0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(1, heads, q_len, head_dim, generator=gen).to(dtype)
    # keys/values inside larger preallocated buffers, as the caches hold them (``offset``: not from slot 0)
    key = torch.randn(1, kv_heads, offset + kv_len + 9, head_dim, generator=gen).to(dtype)[:, :, offset:][:, :, :kv_len]
    value = torch.randn(1, kv_heads, offset + kv_len + 9, head_dim, generator=gen).to(dtype)[:, :, offset:]
    return query, key, value[:, :, :kv_len]


def _assert_close_to_float64(got, query, key, value, scale=None):
    exact = verify_attention_reference(query.double(), key.double(), value.double(), scale)
    torch_err = (verify_attention_reference(query, key, value, scale).double() - exact).abs().max()
    rounding = torch.finfo(query.dtype).eps * exact.abs().max()
    err = (got.double() - exact).abs().max()
    assert err <= 2 * torch_err + rounding + 1e-7, f"error {err:.3g}, torch's {torch_err:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("q_len,kv_len,parts", [(2, 600, 2), (7, 1031, 3), (7, 7067, 2), (21, 2048, 4), (5, 40, 8)])
def test_matches_reference(dtype, heads, kv_heads, q_len, kv_len, parts):
    """Ranges that divide the keys and ones that do not (the last range overlaps the one before, which hides the
    shared keys), the causal tail in the last range, a range barely longer than the queries."""
    query, key, value = _inputs(heads, kv_heads, q_len, kv_len, 64, dtype, seed=kv_len)
    got = verify_attention_cpu(query, key, value, parts=parts)
    assert got is not None and got.shape == query.shape and got.dtype == dtype
    _assert_close_to_float64(got, query, key, value)


def test_scale_and_a_view_that_starts_past_slot_zero():
    query, key, value = _inputs(9, 3, 4, 900, 32, torch.float32, seed=1, offset=13)
    got = verify_attention_cpu(query, key, value, scale=0.3, parts=2)
    _assert_close_to_float64(got, query, key, value, scale=0.3)


def test_declines_what_one_range_serves_or_it_cannot_take():
    """``None`` (the caller runs the reference): one range, ranges shorter than the queries, a batch, a layout whose
    rows are not contiguous."""
    query, key, value = _inputs(9, 3, 7, 900, 16, torch.float32)
    assert verify_attention_cpu(query, key, value, parts=1) is None
    assert verify_attention_cpu(query, key[:, :, :12], value[:, :, :12], parts=2) is None  # 6 keys a range, 7 queries
    assert verify_attention_cpu(query.expand(2, -1, -1, -1), key.expand(2, -1, -1, -1), value.expand(2, -1, -1, -1),
                                parts=2) is None  # fmt: skip
    strided = key.transpose(2, 3).contiguous().transpose(2, 3)  # each key's values a column apart
    assert verify_attention_cpu(query, strided, value, parts=2) is None


def test_verify_attention_takes_it_on_the_cpu(monkeypatch):
    """The dispatcher runs the ranges where they apply (the thread count makes two here) and the reference where
    they do not."""
    seen = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    real = verify_attention_cpu

    def counted(*args, **kwargs):
        seen.append(real(*args, **kwargs) is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr("hf_triforce.kernels.verification.verify_attention_cpu", counted)
    query, key, value = _inputs(9, 3, 7, 2 * MIN_PART_KEYS + 5, 16, torch.float32)
    _assert_close_to_float64(verify_attention(query, key, value), query, key, value)
    short = _inputs(9, 3, 7, MIN_PART_KEYS, 16, torch.float32)
    _assert_close_to_float64(verify_attention(*short), *short)
    assert seen == [True, False]


@pytest.mark.parametrize(
    "batch_heads,kv_len,threads,parts",
    [(3, 7067, 2, 2), (8, 7067, 2, 1), (3, 700, 2, 1), (1, 7067, 16, 13), (4, 100_000, 16, 4), (3, 7067, 1, 1)],
)
def test_key_parts_balance_the_threads(batch_heads, kv_len, threads, parts):
    """As many work items per thread, at least MIN_PART_KEYS keys a range."""
    assert cpu_key_parts(batch_heads, kv_len, threads) == parts
