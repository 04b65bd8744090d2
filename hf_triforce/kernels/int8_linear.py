"""Weight-only int8 linear layers on the CPU (``torch._weight_int8pack_mm``), level 1's copy of the target's weights;
:func:`int8_linear` must equal :func:`int8_linear_reference`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import InvalidInputError

INT8_MAX = 127
K_MULTIPLE = 16  # torch._weight_int8pack_mm reads K in blocks of 16: other K crash it or give wrong sums
# the kernel's cost grows with every row, the float32 few-row path's barely: past this many rows it is no faster
MAX_ROWS = 24


@dataclass(frozen=True)
class Int8Weight:
    """A weight ``[N, K]`` as int8 ``qweight`` ``[N, K]`` times a bfloat16 ``scale`` ``[N]`` per output channel."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The float32 weight ``[N, K]`` this copy stands for."""
        return self.qweight.float() * self.scale.float()[:, None]

    def nbytes(self) -> int:
        """Bytes the copy holds (int8 values and bfloat16 scales)."""
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()

    def rows_product(self, rows: torch.Tensor) -> torch.Tensor:
        """``[M, N]`` bfloat16: ``[M, K]`` bfloat16 ``rows`` times the weight, the kernel alone (no reshape or cast: a
        few-token forward that keeps its rows so saves their dispatch, ~5 us a product on the CPU)."""
        return torch._weight_int8pack_mm(rows, self.qweight, self.scale)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric per-output-channel int8 copy of ``weight`` ``[N, K]`` (an all-zero row gets scale 1)."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / INT8_MAX).to(torch.bfloat16)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    qweight = (w / scale.float()[:, None]).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return Int8Weight(qweight.contiguous(), scale.contiguous())


def int8_kernel_available() -> bool:
    """Whether this torch build has the CPU int8 weight-only matmul (``torch._weight_int8pack_mm``)."""
    return hasattr(torch, "_weight_int8pack_mm")


def int8_kernel_supports(weight: torch.Tensor) -> bool:
    """Whether :func:`int8_linear` serves a weight ``[N, K]``: two dimensions, ``K`` a multiple of 16."""
    return weight.dim() == 2 and weight.shape[1] % K_MULTIPLE == 0 and weight.shape[1] > 0


def use_int8_linear(x: torch.Tensor) -> bool:
    """Whether ``x`` ``[..., K]`` is few enough rows (at most :data:`MAX_ROWS`) for the int8 kernel to be faster.

    Example:
        >>> use_int8_linear(torch.zeros(1, 3, 64)), use_int8_linear(torch.zeros(4, 8, 64))
        (True, False)
    """
    return x.numel() // max(x.shape[-1], 1) <= MAX_ROWS


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight)`` with the int8 copy: ``x`` ``[..., K]`` rounded to bfloat16, the ``[..., N]`` product
    rounded to bfloat16, returned in ``x``'s dtype (``bias`` added in it)."""
    if not int8_kernel_supports(weight.qweight):
        raise InvalidInputError(
            f"int8_linear needs in_features a multiple of {K_MULTIPLE}, got {weight.qweight.shape[1]}."
        )
    out = weight.rows_product(x.reshape(-1, x.shape[-1]).to(torch.bfloat16)).to(x.dtype)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.qweight.shape[0])


def int8_linear_reference(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Pure-torch :func:`int8_linear` (and ``int4_linear``): bfloat16-rounded ``x`` times ``weight.dequantize()``
    (an :class:`Int8Weight` or ``Int4Weight``), rounded to bfloat16."""
    rows = x.to(torch.bfloat16).float()
    out = F.linear(rows, weight.dequantize()).to(torch.bfloat16).to(x.dtype)
    return out if bias is None else out + bias
