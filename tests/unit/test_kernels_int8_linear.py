"""The int8 weight-only linear (level 1's cheaper weights) against its pure-torch reference, and its scoped patch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_triforce.hf.linears import int8_weight_copy, level1_linears, swapped_linears
from hf_triforce.kernels.int8_linear import (
    int8_kernel_available,
    int8_kernel_supports,
    int8_linear,
    int8_linear_reference,
    quantize_int8,
)

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not int8_kernel_available(), reason="torch has no _weight_int8pack_mm"),
]

BF16_EPS = 2.0**-7  # the kernel and the reference both round the product to bfloat16


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16, 33])
@pytest.mark.parametrize("out_features,in_features", [(5, 16), (24, 64), (100, 576), (7, 1536)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_reference(rows, out_features, in_features, dtype, bias):
    gen = torch.Generator().manual_seed(rows * 1000 + in_features)
    weight = quantize_int8(torch.randn(out_features, in_features, generator=gen))
    x = torch.randn(1, rows, in_features, generator=gen).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
    got, expected = int8_linear(x, weight, b), int8_linear_reference(x, weight, b)
    assert got.shape == (1, rows, out_features) and got.dtype == dtype
    scale = expected.abs().max().item()
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 * BF16_EPS, atol=2 * BF16_EPS * scale)


def test_quantization_error_is_half_a_step_per_channel():
    weight = torch.randn(64, 32) * torch.logspace(-3, 1, 64)[:, None]  # channels of very different sizes
    q = quantize_int8(weight)
    step = q.scale.float()[:, None]
    assert q.qweight.dtype == torch.int8 and q.qweight.abs().max() <= 127
    assert ((q.dequantize() - weight).abs() <= step / 2 + 1e-6 * weight.abs()).all()
    assert q.nbytes() == 64 * 32 + 64 * 2


def test_an_all_zero_row_stays_zero():
    q = quantize_int8(torch.zeros(3, 16))
    assert torch.equal(q.dequantize(), torch.zeros(3, 16))
    assert torch.equal(int8_linear(torch.randn(2, 16), q), torch.zeros(2, 3))


def test_unsupported_in_features_are_refused_not_run():
    """torch's kernel reads K in blocks of 16: other K crash it or sum wrongly, so they never reach it."""
    assert not int8_kernel_supports(torch.zeros(4, 24)) and int8_kernel_supports(torch.zeros(4, 32))
    with pytest.raises(ValueError, match="multiple of 16"):
        int8_linear(torch.randn(1, 24), quantize_int8(torch.randn(4, 24)))


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.Linear(8, 4))


def test_copy_is_kept_and_remade_when_a_weight_changes():
    model = _model()
    copy = int8_weight_copy(model)
    assert set(copy) == {model[0], model[2]}  # in_features 8 stays on its own weights
    assert int8_weight_copy(model) is copy
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # in place: the version counter moves
    remade = int8_weight_copy(model)
    assert remade is not copy
    torch.testing.assert_close(remade[model[0]].dequantize(), model[0].weight, atol=0.05, rtol=0.02)


def test_copy_of_a_model_made_under_inference_mode():
    """Inference tensors have no version counter; the copy is still made, and kept while the tensors stay."""
    with torch.inference_mode():
        model = _model()
        copy = int8_weight_copy(model)
        assert int8_weight_copy(model) is copy and model[0] in copy


def test_swap_computes_with_the_copy_inside_level1_only_and_is_undone():
    model = _model()
    x = torch.randn(3, 16)
    copy = int8_weight_copy(model)
    with torch.no_grad():
        expected = int8_linear_reference(F.relu(int8_linear_reference(x, copy[model[0]], model[0].bias)),
                                         copy[model[2]], model[2].bias)  # fmt: skip
        expected, full = model[3](expected), model(x)
        with swapped_linears([model], copy):
            patched = {m: vars(m)["forward"] for m in model if isinstance(m, torch.nn.Linear)}
            with level1_linears():
                got = model(x)
            torch.testing.assert_close(model(x), full, atol=1e-6, rtol=1e-6)  # outside level 1: the own weights
            assert all(vars(m)["forward"] is patched[m] for m in patched)  # one swap for the whole call
    assert not any("forward" in vars(m) for m in model)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_wide_forwards_use_the_layers_own_weights():
    """More rows than MAX_ROWS (a wide batch) go through the layer's own weights inside level 1 too."""
    from hf_triforce.kernels.int8_linear import MAX_ROWS

    model = _model()
    wide, narrow = torch.randn(MAX_ROWS + 1, 16), torch.randn(MAX_ROWS, 16)
    with torch.no_grad(), swapped_linears([model], int8_weight_copy(model)):
        expected_wide, expected_narrow = model(wide), model(narrow)
        with level1_linears():
            assert torch.equal(model(wide), expected_wide)
            assert not torch.equal(model(narrow), expected_narrow)  # the copy served these
