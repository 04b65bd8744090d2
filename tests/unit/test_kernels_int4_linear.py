"""The int4 weight-only linear (level 1's cheapest weights) against its pure-torch reference, and its resolution."""

from __future__ import annotations

import pytest
import torch

from hf_triforce.kernels.int4_linear import (
    GROUP_SIZE,
    inner_k_tiles,
    int4_kernel_available,
    int4_kernel_supports,
    int4_linear,
    int4_linear_reference,
    pack_nibbles,
    quantize_int4,
    unpack_nibbles,
)

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not int4_kernel_available(), reason="torch has no _weight_int4pack_mm_for_cpu"),
]

BF16_EPS = 2.0**-7  # the kernel and the reference both round the product to bfloat16


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16, 24])
@pytest.mark.parametrize("out_features,in_features", [(16, 32), (48, 64), (960, 576), (64, 1536)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_reference(rows, out_features, in_features, dtype, bias):
    gen = torch.Generator().manual_seed(rows * 1000 + in_features)
    weight = quantize_int4(torch.randn(out_features, in_features, generator=gen) * 0.05)
    x = torch.randn(1, rows, in_features, generator=gen).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
    got, expected = int4_linear(x, weight, b), int4_linear_reference(x, weight, b)
    assert got.shape == (1, rows, out_features) and got.dtype == dtype
    scale = expected.abs().max().item()
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 * BF16_EPS, atol=2 * BF16_EPS * scale)


@pytest.mark.parametrize("group_size", [32, 64])
def test_quantization_error_is_half_a_step_per_group(group_size):
    """Each weight is within half a quantization step of its group (plus the bfloat16 rounding of scale and zero),
    for groups of very different sizes; the values span 0..15 and the packed nibbles hold them."""
    weight = torch.randn(32, 4 * group_size) * torch.logspace(-3, 1, 32)[:, None]
    q = quantize_int4(weight, group_size)
    groups = weight.view(32, 4, group_size)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    error = (q.dequantize() - weight).abs().view(32, 4, group_size).amax(-1)
    assert bool((error <= step * (0.5 + 8 * BF16_EPS) + 1e-6).all())
    assert q.values().min() == 0 and q.values().max() == 15
    assert q.values().shape == (32, 4 * group_size) and q.scales_and_zeros.shape == (4, 32, 2)


@pytest.mark.parametrize(
    "out_features,in_features,group_size", [(16, 32, 32), (48, 128, 32), (960, 576, 32), (64, 256, 64)]
)
def test_values_read_back_from_the_packed_layout_are_the_rounded_weights(out_features, in_features, group_size):
    """The copy holds its values once, in the kernel's layout; what ``values()`` reads back through the kernel is,
    weight by weight, ``round((w - zero) / scale + 8)`` clamped to 0..15 with the copy's own scale and zero."""
    gen = torch.Generator().manual_seed(in_features + group_size)
    weight = torch.randn(out_features, in_features, generator=gen)
    q = quantize_int4(weight, group_size)
    scale, zero = q.scales_and_zeros.float().permute(2, 1, 0)  # [N, K / group_size] each
    groups = weight.view(out_features, in_features // group_size, group_size)
    by_hand = ((groups - zero[..., None]) / scale[..., None] + 8).round().clamp(0, 15).view(out_features, in_features)
    assert torch.equal(q.values(), by_hand.to(torch.int32))
    assert (q.out_features, q.in_features) == (out_features, in_features)
    assert q.nbytes() == out_features * in_features // 2 + 2 * 2 * out_features * in_features // group_size


def test_a_constant_group_is_exact():
    weight = torch.full((16, 64), 0.25)
    weight[:, 32:] = -1.5
    torch.testing.assert_close(quantize_int4(weight).dequantize(), weight, rtol=0, atol=1e-6)


def test_shapes_the_kernel_cannot_serve_are_refused():
    assert int4_kernel_supports(torch.zeros(16, GROUP_SIZE))
    assert not int4_kernel_supports(torch.zeros(8, 64))  # out_features: a multiple of 16
    assert not int4_kernel_supports(torch.zeros(16, 48))  # in_features: a multiple of the group
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_int4(torch.zeros(8, 64))


# ---------------------------------------------------------------------------------------------------------------
# CUDA: the tinygemm kernel (torch._weight_int4pack_mm), same quantization, same reference

CUDA_INT4 = pytest.mark.skipif(not int4_kernel_available("cuda"), reason="needs CUDA int4 (compute capability 8.0+)")


def test_nibbles_hold_two_values_a_byte_even_channel_high():
    values = torch.randint(0, 16, (48, 128), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = pack_nibbles(values)
    assert packed.dtype == torch.uint8 and packed.shape == (48, 64)
    assert torch.equal(unpack_nibbles(packed), values)
    assert torch.equal(packed[:, 0].int(), values[:, 0] * 16 + values[:, 1])


def test_cuda_tiles_and_refusals_off_cuda():
    assert [inner_k_tiles(k) for k in (4096, 14336, 576, 96, 32)] == [8, 8, 4, 2, 2]
    assert not int4_kernel_available("meta")


@pytest.mark.gpu
@CUDA_INT4
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("out_features,in_features", [(16, 32), (960, 576), (1024, 4096), (64, 1536)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_kernel_matches_reference(rows, out_features, in_features, dtype):
    """On CUDA: the values read back through the kernel are the quantization's rounding of each weight with the
    copy's own scale and zero, and the product equals the reference within two bfloat16 steps."""
    gen = torch.Generator().manual_seed(rows * 1000 + in_features)
    weight = torch.randn(out_features, in_features, generator=gen) * 0.05
    q = quantize_int4(weight.cuda())
    scale, zero = q.scales_and_zeros.float().cpu().permute(2, 1, 0)
    groups = weight.view(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    by_hand = ((groups - zero[..., None]) / scale[..., None] + 8).round().clamp(0, 15).view(out_features, in_features)
    assert torch.equal(q.values().cpu(), by_hand.to(torch.int32))
    x = torch.randn(1, rows, in_features, generator=gen).to("cuda", dtype)
    got, expected = int4_linear(x, q), int4_linear_reference(x, q)
    assert got.shape == (1, rows, out_features) and got.dtype == dtype and got.is_cuda
    scale = expected.abs().max().item()
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 * BF16_EPS, atol=2 * BF16_EPS * scale)


@pytest.mark.gpu
@CUDA_INT4
def test_cuda_kernel_replays_in_a_cuda_graph():
    q = quantize_int4(torch.randn(256, 512, device="cuda") * 0.05)
    x = torch.randn(2, 512, device="cuda", dtype=torch.bfloat16)
    eager = int4_linear(x, q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        int4_linear(x, q)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int4_linear(x, q)
    graph.replay()
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
