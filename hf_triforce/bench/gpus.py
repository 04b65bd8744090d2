"""The GPUs ``hf-triforce estimate`` knows: peak memory bandwidth and memory, or a bandwidth given in GB/s.

Example:
    >>> gpu = resolve_gpu("h100")
    >>> gpu.name, gpu.bandwidth, gpu.memory_bytes
    ('H100', 3350000000000.0, 80000000000)
    >>> resolve_gpu("2000").name, resolve_gpu("2000").memory_bytes is None
    ('2000 GB/s', True)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInputError
from .bandwidth import PEAK_BANDWIDTH

GPU_MEMORY = {"H200": 141e9, "H100": 80e9, "A100": 80e9, "L40S": 48e9, "RTX 4090": 24e9}
"""Device memory in bytes of each GPU of :data:`~hf_triforce.bench.bandwidth.PEAK_BANDWIDTH` (A100: 80 GB)."""
ALIASES = {"h200": "H200", "h100": "H100", "a100": "A100", "l40s": "L40S", "4090": "RTX 4090", "rtx4090": "RTX 4090"}
"""``--gpu`` names, lowercase, to their :data:`~hf_triforce.bench.bandwidth.PEAK_BANDWIDTH` keys."""


@dataclass(frozen=True)
class Gpu:
    """A GPU as the bandwidth model sees it: ``bandwidth`` in bytes/s, ``memory_bytes`` (``None``: unknown)."""

    name: str
    bandwidth: float
    memory_bytes: int | None


def resolve_gpu(spec: str) -> Gpu:
    """The GPU named ``spec`` (``h100``, ``h200``, ``a100``, ``l40s``, ``4090``; any case) or a bandwidth in GB/s.

    Raises:
        InvalidInputError: neither a known name nor a positive number.
    """
    key = ALIASES.get(spec.strip().lower().replace(" ", "").replace("-", ""))
    if key is not None:
        return Gpu(key, PEAK_BANDWIDTH[key], int(GPU_MEMORY[key]))
    try:
        gb_per_s = float(spec)
    except ValueError:
        gb_per_s = float("nan")
    if not gb_per_s > 0 or gb_per_s == float("inf"):
        raise InvalidInputError(
            f"--gpu {spec!r}: give one of {', '.join(sorted(ALIASES))} or the GPU's memory bandwidth in GB/s "
            "(e.g. --gpu 3350)."
        )
    return Gpu(f"{gb_per_s:g} GB/s", gb_per_s * 1e9, None)
