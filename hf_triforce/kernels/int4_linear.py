"""Weight-only int4 linear layers for level 1: half the bytes of the int8 copy on the CPU, a quarter of bfloat16 on
CUDA.

A level-1 step on the CPU is bound by reading the weights. With level 1's int8 copy (:mod:`.int8_linear`) SmolLM2's
decoder layers still read about 105 MiB per step; an int4 copy of them, in groups of :data:`GROUP_SIZE` input
channels each with its own bfloat16 scale and zero, is half of that, and ``torch._weight_int4pack_mm_for_cpu``
multiplies bfloat16 rows by it. Measured on the 2-core AMD EPYC CI machine, SmolLM2's linears summed: 9.8 -> 4.9 ms
for one row, 16.8 -> 8.1 ms for four. Level 1 only drafts: the full-cache verification still runs the float32
weights and decides every token, so the output is unchanged; the coarser copy only moves level 1's acceptance.

Quantization is asymmetric per group: ``q = round((w - min) / scale)`` in ``0..15`` with ``scale = (max - min) /
15``, and the weight it stands for is ``(q - 8) * scale + zero`` with ``zero = min + 8 * scale`` (the convention of
the kernel's ``scales_and_zeros``; scale and zero rounded to bfloat16). :func:`int4_linear` is the kernel,
:func:`int4_linear_reference` the pure-torch computation it must equal (bfloat16 inputs, the de-quantized weight,
a bfloat16-rounded result). The copy holds the values once, in the kernel's packed layout; the reference reads them
back through the kernel with unit scales (:meth:`Int4Weight.values`), and the tests check them against the
quantization's rounding, so the packing is tested on its own and the product against the reference.

On CUDA (compute capability 8.0 or newer) the same quantization runs through ``torch._weight_int4pack_mm``, the
tinygemm kernel gpt-fast drafts with: the same ``scales_and_zeros`` convention, the values packed two to a byte
(:func:`pack_nibbles`) and then into the kernel's tiles (``torch._convert_weight_to_int4pack``). A level-1 step of
an 8B model reads 15.3 of its 15.8 GB as weights in bfloat16; its int4 copy is about 4 GB. Whether that makes
level 1 faster on a given GPU is measured by ``benchmarks/gpu_run.sh`` (``level1_weights="auto"`` stays ``"full"``
on CUDA until it is).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

GROUP_SIZE = 32
"""Input channels per scale and zero (32: SmolLM2's level-1 acceptance at 7K tokens, T=0.6, held within about 0.01
of the int8 copy's; 64 lost about 0.08)."""
N_MULTIPLE = 16  # torch's int4 packing needs out_features a multiple of 16
LEVELS = 15  # int4 values 0..15
K_TILE = 16  # CUDA: in_features come in tiles of 16, ``inner_k_tiles`` (2, 4 or 8) of them per packed row


@dataclass(frozen=True)
class Int4Weight:
    """A weight ``[N, K]`` as int4 values in groups of ``group_size`` input channels.

    ``packed`` is the kernel's layout of the values (``torch._convert_weight_to_int4pack_for_cpu``),
    ``scales_and_zeros`` ``[K / group_size, N, 2]`` bfloat16. The values are held once, in the kernel's layout:
    :meth:`values` reads them back through the kernel itself, so the copy is half a byte per weight plus the scales.
    """

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    group_size: int

    @property
    def out_features(self) -> int:
        return self.scales_and_zeros.shape[1]

    @property
    def in_features(self) -> int:
        return self.scales_and_zeros.shape[0] * self.group_size

    def values(self) -> torch.Tensor:
        """The int4 values ``[N, K]`` (``0..15``, as int32), read back from :attr:`packed`: with scale 1 and zero 8
        the weight a value stands for is the value itself, so the kernel's product of the ``K x K`` identity is
        them (``[K, N]``, small integers, exact in bfloat16). The tests check them against the rounding that
        :func:`quantize_int4` does."""
        device = self.packed.device
        ones = torch.ones(self.scales_and_zeros.shape[:2], dtype=torch.bfloat16, device=device)
        unit = torch.stack([ones, 8 * ones], dim=-1)  # [K / group_size, N, 2]: scale 1, zero 8
        eye = torch.eye(self.in_features, dtype=torch.bfloat16, device=device)
        return _int4_mm(eye, self.packed, self.group_size, unit).T.to(torch.int32)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight ``[N, K]`` this copy stands for: ``(q - 8) * scale + zero`` per group."""
        q = self.values().float()
        n, k = q.shape
        scale, zero = self.scales_and_zeros.float().permute(2, 1, 0)  # [N, K / group] each
        groups = q.view(n, k // self.group_size, self.group_size)
        return ((groups - 8) * scale[..., None] + zero[..., None]).view(n, k)

    def nbytes(self) -> int:
        """Bytes the copy holds (the kernel's values, scales and zeros)."""
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_and_zeros))


def int4_kernel_available(device: torch.device | str = "cpu") -> bool:
    """Whether this torch build has the int4 weight-only matmul for ``device``: on the CPU
    ``torch._weight_int4pack_mm_for_cpu``, on CUDA ``torch._weight_int4pack_mm`` on a GPU of compute capability 8.0
    or newer (tinygemm's tensor-core path).

    Example:
        >>> isinstance(int4_kernel_available(), bool), int4_kernel_available("meta")
        (True, False)
    """
    device = torch.device(device)
    if device.type == "cuda":
        usable = hasattr(torch, "_weight_int4pack_mm") and torch.cuda.is_available()
        return usable and torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type != "cpu":
        return False
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_convert_weight_to_int4pack_for_cpu")


def int4_kernel_supports(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> bool:
    """Whether :func:`int4_linear` serves a weight ``[N, K]``: ``N`` a multiple of 16, ``K`` of ``group_size`` (on
    CUDA also of 32: two tiles of 16 inputs at least).

    Example:
        >>> int4_kernel_supports(torch.zeros(960, 576)), int4_kernel_supports(torch.zeros(8, 576))
        (True, False)
    """
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    tiles = k % (2 * K_TILE) == 0 if weight.device.type == "cuda" else True
    return n > 0 and k > 0 and n % N_MULTIPLE == 0 and k % group_size == 0 and tiles


def pack_nibbles(values: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` int4 values (``0..15``) two to a byte, ``[N, K / 2]`` uint8: the even input channel in the high
    nibble, the odd one in the low (the layout ``torch._convert_weight_to_int4pack`` takes on CUDA).

    Example:
        >>> pack_nibbles(torch.tensor([[1, 2, 15, 0]])).tolist(), unpack_nibbles(pack_nibbles(torch.tensor([[1, 2]])))
        ([[18, 240]], tensor([[1, 2]], dtype=torch.int32))
    """
    values = values.to(torch.int32)
    return (values[:, ::2] << 4 | values[:, 1::2]).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The ``[N, K]`` int32 values :func:`pack_nibbles` packed (its inverse)."""
    packed = packed.to(torch.int32)
    return torch.stack([packed >> 4, packed & 15], dim=-1).flatten(1)


def inner_k_tiles(in_features: int) -> int:
    """How many 16-input tiles the CUDA kernel packs per row: 8 where ``in_features`` allows, else 4 or 2.

    Example:
        >>> inner_k_tiles(4096), inner_k_tiles(576), inner_k_tiles(96)
        (8, 4, 2)
    """
    return next(tiles for tiles in (8, 4, 2) if in_features % (tiles * K_TILE) == 0)


def _int4_pack(values: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` int32 values in the kernel's packed layout for their device."""
    if values.device.type == "cuda":
        return torch._convert_weight_to_int4pack(pack_nibbles(values).contiguous(), inner_k_tiles(values.shape[1]))
    return torch._convert_weight_to_int4pack_for_cpu(values.contiguous(), 1)


def _int4_mm(rows: torch.Tensor, packed: torch.Tensor, group_size: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """``[M, N]`` bfloat16: ``[M, K]`` bfloat16 ``rows`` times the packed weight, by the kernel of its device."""
    if packed.device.type == "cuda":
        return torch._weight_int4pack_mm(rows, packed, group_size, scales_and_zeros)
    return torch._weight_int4pack_mm_for_cpu(rows, packed, group_size, scales_and_zeros)


def quantize_int4(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> Int4Weight:
    """Asymmetric int4 copy of ``weight`` ``[N, K]``, one bfloat16 scale and zero per group of ``group_size`` inputs.

    Example:
        >>> w = torch.linspace(-1, 1, 16 * 32).view(16, 32)
        >>> q = quantize_int4(w)
        >>> q.values().min().item(), q.values().max().item(), bool((q.dequantize() - w).abs().max() < 0.01)
        (0, 15, True)
    """
    if not int4_kernel_supports(weight, group_size):
        raise ValueError(
            f"quantize_int4 needs out_features a multiple of {N_MULTIPLE} and in_features of {group_size}, got "
            f"{tuple(weight.shape)}."
        )
    w = weight.detach().float()
    n, k = w.shape
    groups = w.view(n, k // group_size, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / LEVELS).clamp(min=torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
    zero = (low + 8 * scale.float()).to(torch.bfloat16)
    # The values for the rounded scale and zero: w ~= (q - 8) * scale + zero, i.e. q = (w - zero) / scale + 8.
    q = ((groups - zero.float()[..., None]) / scale.float()[..., None] + 8).round().clamp(0, LEVELS).to(torch.int32)
    q = q.view(n, k)
    return Int4Weight(
        packed=_int4_pack(q),
        scales_and_zeros=torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous(),
        group_size=group_size,
    )


def int4_linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight)`` with the int4 copy: ``x`` rounded to bfloat16, the product rounded to bfloat16.

    Args:
        x: ``[..., K]`` float inputs on the weight's device (the CPU, or CUDA).
        weight: the :class:`Int4Weight` of an ``[N, K]`` weight.
        bias: optional ``[N]``, added in ``x``'s dtype.

    Returns:
        ``[..., N]`` in ``x``'s dtype.

    Example:
        >>> x, w = torch.randn(1, 3, 64), torch.randn(32, 64)
        >>> q = quantize_int4(w)
        >>> torch.allclose(int4_linear(x, q), int4_linear_reference(x, q), rtol=2e-2, atol=5e-2)
        True
    """
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    out = _int4_mm(rows, weight.packed, weight.group_size, weight.scales_and_zeros)
    out = out.to(x.dtype)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.out_features)


def int4_linear_reference(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Pure-torch :func:`int4_linear`: bfloat16-rounded ``x`` times the de-quantized weight
    (:meth:`Int4Weight.dequantize`), rounded to bfloat16.

    Example:
        >>> q = quantize_int4(torch.eye(32)[:16].contiguous())
        >>> int4_linear_reference(torch.ones(1, 32), q)[0, :3].tolist()
        [1.0, 1.0, 1.0]
    """
    rows = x.to(torch.bfloat16).float()
    out = F.linear(rows, weight.dequantize()).to(torch.bfloat16).to(x.dtype)
    return out if bias is None else out + bias
