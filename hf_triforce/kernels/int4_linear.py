"""Weight-only int4 linear layers for level 1; per group of :data:`GROUP_SIZE` inputs a bfloat16 scale and zero:
``q`` in ``0..15`` stands for ``(q - 8) * scale + zero``. :func:`int4_linear` must equal its reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidInputError
from .int8_linear import int8_linear_reference

GROUP_SIZE = 32
"""Input channels per scale and zero (32 keeps level 1's acceptance close to the int8 copy's; 64 lost noticeably)."""
N_MULTIPLE = 16  # torch's int4 packing needs out_features a multiple of 16
LEVELS = 15  # int4 values 0..15
K_TILE = 16  # CUDA: in_features come in tiles of 16, ``inner_k_tiles`` (2, 4 or 8) of them per packed row


@dataclass(frozen=True)
class Int4Weight:
    """A weight ``[N, K]`` as int4 values in groups of ``group_size`` input channels.

    ``packed``: the values in the kernel's layout (half a byte each); ``scales_and_zeros``: ``[K / group_size, N, 2]``.
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
        """The int4 values ``[N, K]`` (``0..15``, int32), read back from :attr:`packed`: with scale 1 and zero 8 a value
        stands for itself, so the kernel's product of the identity is them (small integers, exact in bfloat16)."""
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

    def rows_product(self, rows: torch.Tensor) -> torch.Tensor:
        """``[M, N]`` bfloat16: ``[M, K]`` bfloat16 ``rows`` times the weight, the kernel alone (no reshape or cast: a
        few-token forward that keeps its rows so saves their dispatch, ~5 us a product on the CPU)."""
        return _int4_mm(rows, self.packed, self.group_size, self.scales_and_zeros)


def int4_kernel_available(device: torch.device | str = "cpu") -> bool:
    """Whether this torch build has the int4 matmul for ``device``: ``torch._weight_int4pack_mm_for_cpu`` on the CPU,
    ``torch._weight_int4pack_mm`` on a CUDA GPU of compute capability 8.0 or newer."""
    device = torch.device(device)
    if device.type == "cuda":
        usable = hasattr(torch, "_weight_int4pack_mm") and torch.cuda.is_available()
        return usable and torch.cuda.get_device_capability(device) >= (8, 0)
    cpu_kernel = hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_convert_weight_to_int4pack_for_cpu")
    return device.type == "cpu" and cpu_kernel


def int4_kernel_supports(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> bool:
    """Whether :func:`int4_linear` serves weight ``[N, K]``: ``N % 16 == 0``, ``K % group_size == 0`` (32 on CUDA)."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    tiles = k % (2 * K_TILE) == 0 if weight.device.type == "cuda" else True
    return n > 0 and k > 0 and n % N_MULTIPLE == 0 and k % group_size == 0 and tiles


def pack_nibbles(values: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` int4 values two to a byte, ``[N, K / 2]`` uint8: the even input channel in the high nibble, the odd
    one in the low (the layout ``torch._convert_weight_to_int4pack`` takes on CUDA)."""
    values = values.to(torch.int32)
    return (values[:, ::2] << 4 | values[:, 1::2]).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The ``[N, K]`` int32 values :func:`pack_nibbles` packed (its inverse)."""
    packed = packed.to(torch.int32)
    return torch.stack([packed >> 4, packed & 15], dim=-1).flatten(1)


def inner_k_tiles(in_features: int) -> int:
    """How many 16-input tiles the CUDA kernel packs per row: 8 where ``in_features`` allows, else 4 or 2."""
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
    """Asymmetric int4 copy of ``weight`` ``[N, K]``, one bfloat16 scale and zero per group of ``group_size`` inputs."""
    if not int4_kernel_supports(weight, group_size):
        raise InvalidInputError(
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
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
    return Int4Weight(packed=_int4_pack(q.view(n, k)), scales_and_zeros=scales_and_zeros, group_size=group_size)


def int4_linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight)`` with the int4 copy: ``x`` ``[..., K]`` (on the weight's device) rounded to bfloat16, the
    ``[..., N]`` product rounded to bfloat16, returned in ``x``'s dtype (``bias`` added in it)."""
    out = weight.rows_product(x.reshape(-1, x.shape[-1]).to(torch.bfloat16)).to(x.dtype)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.out_features)


int4_linear_reference = int8_linear_reference
"""Pure-torch :func:`int4_linear`: bfloat16-rounded ``x`` times :meth:`Int4Weight.dequantize`, rounded to bfloat16."""
