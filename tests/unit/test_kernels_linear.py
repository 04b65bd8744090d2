"""``small_batch_linear`` against ``torch.nn.functional.linear``, and the scoped swap of ``nn.Linear`` layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_triforce.hf.linears import swapped_linears
from hf_triforce.kernels.linear import MAX_ROWS, linear_forward, small_batch_linear, use_small_batch_linear

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("shape", [(1, 1, 16), (16,), (1, 2, 16), (1, 7, 16), (3, 16), (2, 3, 16), (1, MAX_ROWS, 16)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_functional_linear(shape, bias):
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(*shape, generator=gen), torch.randn(24, 16, generator=gen)
    b = torch.randn(24, generator=gen) if bias else None
    got = small_batch_linear(x, weight, b)
    assert got.shape == (*shape[:-1], 24) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, weight, b), atol=1e-5, rtol=1e-5)


def test_only_few_float32_cpu_rows_take_the_fast_path(monkeypatch):
    monkeypatch.setattr("hf_triforce.kernels.linear.one_row_product_faster", lambda: True)
    weight = torch.randn(8, 4)
    with torch.no_grad():
        assert use_small_batch_linear(torch.randn(1, 3, 4), weight)
        assert use_small_batch_linear(torch.randn(1, 1, 4), weight)
        assert not use_small_batch_linear(torch.randn(1, MAX_ROWS + 1, 4), weight)  # prefill-sized
        assert not use_small_batch_linear(torch.randn(1, 3, 4).bfloat16(), weight.bfloat16())
    assert not use_small_batch_linear(torch.randn(1, 3, 4), weight)  # autograd on: leave training alone


@pytest.mark.parametrize(
    "capability,expected", [("AVX512", True), ("AVX2", False), ("DEFAULT", False), ("SVE256", False)]
)
def test_one_row_takes_the_two_column_product_on_avx512_only(monkeypatch, capability, expected):
    """Read from the CPU's capability, not timed: no random number drawn; two rows or more always take the few-row
    product."""
    import hf_triforce.kernels.linear as linear

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    linear.one_row_product_faster.cache_clear()
    weight, one, two = torch.randn(8, 4), torch.randn(1, 4), torch.randn(2, 4)
    state = torch.random.get_rng_state()
    try:
        with torch.no_grad():
            assert use_small_batch_linear(one, weight) is expected
            assert use_small_batch_linear(one[None], weight) is expected
            assert use_small_batch_linear(two, weight)
    finally:
        linear.one_row_product_faster.cache_clear()
    assert torch.equal(state, torch.random.get_rng_state())


def test_scoped_swap_is_undone_and_tolerates_the_same_model_twice():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = model(x)
        with swapped_linears([model, model, None]):
            assert all("forward" in vars(m) for m in model if isinstance(m, torch.nn.Linear))
            torch.testing.assert_close(model(x), expected, atol=1e-6, rtol=1e-6)
    assert not any("forward" in vars(m) for m in model)


def test_linear_forward_falls_back_for_many_rows():
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(MAX_ROWS + 1, 4)
    with torch.no_grad():
        assert torch.equal(linear_forward(layer, x), layer(x))
