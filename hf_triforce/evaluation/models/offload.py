"""Long context on a GPU that cannot hold it: what fits with ``TriForceConfig(offload_kv=True)``, and what a token
costs then, against the offloading a transformers user already has.

Sizing. Offloaded, the device holds the weights, two layers of the full cache (the buffers each full-cache forward
streams through), the chunk means, the retrieval views, the prefill's activations and the decoding transients; the
host holds the whole cache (:func:`offloaded_estimate`). :func:`longest_context` finds the longest context that fits
a device (and a host) with and without offloading.

Cost per token (modeled: the bus and the memory at their peak, nothing overlapped that need not be):

* **plain ``generate()`` with transformers' offloaded cache** (``cache_implementation="offloaded"``,
  ``DynamicCache(offloading=True)``): every decoding step copies every offloaded layer's keys and values to the
  device (the next layer while one computes): the whole cache over the bus per token;
* **accelerate's ``device_map`` with CPU offload** moves weights, not the cache: the cache must fit the device, so
  it does not serve a context whose cache is larger than the GPU;
* **TriForce offloaded**: a verification streams the whole cache once, for the tokens a round yields (level-1
  drafts at the measured per-token acceptance); level-1 steps read the weights and the view from device memory.

Example:
    >>> from hf_triforce.evaluation.models.shapes import preset_config
    >>> cfg = preset_config("llama2-7b", 131072)
    >>> round(plain_offloaded_ms(cfg, 131072, 2, PCIE4_X16) / 1e3, 2)  # seconds a token: 64 GiB over PCIe 4.0
    2.75
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...config import TriForceConfig
from .bandwidth import PEAK_BANDWIDTH, expected_tokens, kv_bytes_per_token, weight_bytes
from .memory import GIB, MemoryEstimate, triforce_generate_estimate
from .memory_fit import required_bytes
from .shapes import preset_config, text_config

PCIE4_X16 = 25e9
"""Bytes/s a PCIe 4.0 x16 link moves host -> device in practice (an RTX 4090's; 32 GB/s peak)."""
RTX_4090 = (24 * GIB, PEAK_BANDWIDTH["RTX 4090"], PCIE4_X16)
"""(memory, HBM bytes/s, PCIe bytes/s) of the card TriForce's paper offloads on."""


def offloaded_estimate(
    config, context: int, dtype_bytes: int, triforce_config: TriForceConfig, draft_config=None
) -> MemoryEstimate:
    """The device's peak with ``offload_kv=True``: the peak of
    :func:`~hf_triforce.evaluation.models.memory.triforce_generate_estimate` with the full cache's ``kv`` term replaced
    by the two layers a full-cache forward streams through.

    Example:
        >>> from hf_triforce.evaluation.models.shapes import preset_config
        >>> cfg, tc = preset_config("llama2-7b", 131072), TriForceConfig(prefill_chunk_size=8192)
        >>> est = offloaded_estimate(cfg, 131072, 2, tc)
        >>> round(est.kv / 2**30, 2)  # two of the 32 layers of a 128K cache
        4.0
    """
    estimate = triforce_generate_estimate(config, context, dtype_bytes, triforce_config, draft_config)
    layers = text_config(config).num_hidden_layers
    return replace(estimate, kv=2 * estimate.kv // layers)


def host_bytes(config, context: int, dtype_bytes: int, triforce_config: TriForceConfig) -> int:
    """Host memory the offloaded full cache takes (its capacity for ``context`` tokens).

    Example:
        >>> from hf_triforce.evaluation.models.shapes import preset_config
        >>> round(host_bytes(preset_config("llama2-7b", 131072), 131072, 2, TriForceConfig()) / 2**30, 1)
        64.0
    """
    return triforce_config.full_cache_capacity(context) * kv_bytes_per_token(text_config(config), dtype_bytes)


def longest_context(
    config,
    dtype_bytes: int,
    triforce_config: TriForceConfig,
    device_bytes: int,
    host_memory: int | None = None,
    multiple: int = 1024,
    limit: int = 1 << 20,
) -> int:
    """The longest context (a multiple of ``multiple``, at most ``limit``) whose TriForce call fits ``device_bytes``
    of device memory (with the memory fit's margins), and, when ``triforce_config.offload_kv``, whose full cache fits
    ``host_memory`` (``None``: unbounded); 0 if none.

    Example:
        >>> from hf_triforce.evaluation.models.shapes import preset_config
        >>> cfg = preset_config("llama2-7b", 1 << 20)
        >>> tc = TriForceConfig(prefill_chunk_size=4096, cuda_graphs=True)
        >>> longest_context(cfg, 2, tc, 24 * GIB), longest_context(cfg, 2, replace(tc, offload_kv=True), 24 * GIB)
        (13312, 117760)
    """

    def fits(context: int) -> bool:
        if not triforce_config.offload_kv:
            return required_bytes(triforce_generate_estimate(config, context, dtype_bytes, triforce_config)) <= (
                device_bytes
            )
        host_ok = host_memory is None or host_bytes(config, context, dtype_bytes, triforce_config) <= host_memory
        device = required_bytes(offloaded_estimate(config, context, dtype_bytes, triforce_config))
        return host_ok and device <= device_bytes

    lo, hi = 0, limit // multiple + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * multiple) else (lo, mid)
    return lo * multiple


def plain_offloaded_ms(config, context: int, dtype_bytes: int, bus: float) -> float:
    """Modeled ms a token of plain ``generate()`` with transformers' offloaded cache: the whole cache over the bus.

    Its compute (the weights read from device memory) overlaps the next layer's copy, so the bus bounds it.
    """
    return 1e3 * context * kv_bytes_per_token(text_config(config), dtype_bytes) / bus


@dataclass(frozen=True)
class OffloadedRound:
    """A modeled TriForce round with the cache offloaded: ``gamma2`` level-1 drafts, one streamed verification."""

    tokens: float
    verification_ms: float
    drafting_ms: float

    @property
    def ms_per_token(self) -> float:
        return (self.verification_ms + self.drafting_ms) / self.tokens


def triforce_offloaded_round(
    config, context: int, dtype_bytes: int, triforce_config: TriForceConfig, acceptance: float, hbm: float, bus: float
) -> OffloadedRound:
    """Modeled TriForce round with ``offload_kv=True``: the verification streams the whole cache (the bus bounds it,
    as for plain offloaded decoding), each of ``gamma2`` level-1 steps reads the weights and the view from device
    memory, and the round yields :func:`~hf_triforce.evaluation.models.bandwidth.expected_tokens` at the per-token
    level-1 ``acceptance`` (level 0 and the refresh are left out: small beside either).

    Example:
        >>> from hf_triforce.evaluation.models.shapes import preset_config
        >>> cfg, tc = preset_config("llama2-7b", 131072), TriForceConfig(gamma2=16)
        >>> round(triforce_offloaded_round(cfg, 131072, 2, tc, 0.9, *RTX_4090[1:]).ms_per_token)
        360
    """
    text, tc = text_config(config), triforce_config
    per_token = kv_bytes_per_token(text, dtype_bytes)
    verification = 1e3 * context * per_token / bus
    step = 1e3 * (weight_bytes(text, dtype_bytes) + min(tc.retrieval_budget, context) * per_token) / hbm
    return OffloadedRound(expected_tokens(acceptance, tc.gamma2), verification, tc.gamma2 * step)


SHAPES = ("llama2-7b", "llama3.1-8b")
GPUS = (24, 48, 80)


def sizing_table(dtype_bytes: int = 2, prefill_chunk: int = 4096) -> str:
    """Markdown: the longest context TriForce fits on a GPU of 24, 48 and 80 GiB, without and with ``offload_kv``
    (the 7B MHA and 8B GQA shapes in bfloat16, static view, the memory fit's margins; the host unbounded).

    Example:
        >>> sizing_table().splitlines()[2].startswith("| llama2-7b | 24 GiB |")
        True
    """
    rows = ["| shape | GPU memory | longest context, cache on the GPU | longest context, offload_kv=True |",
            "|---|---|---:|---:|"]  # fmt: skip
    tc = TriForceConfig(prefill_chunk_size=prefill_chunk, cuda_graphs=True)
    for shape in SHAPES:
        config = preset_config(shape, 1 << 20)
        for gib in GPUS:
            on_gpu = longest_context(config, dtype_bytes, tc, gib * GIB)
            offloaded = longest_context(config, dtype_bytes, replace(tc, offload_kv=True), gib * GIB)
            longest = f"{offloaded:,}" if offloaded < (1 << 20) else "> 1,000,000"
            rows.append(f"| {shape} | {gib} GiB | {on_gpu:,} | {longest} |")
    return "\n".join(rows) + "\n"


def cost_table(acceptance: float, context: int = 131072, dtype_bytes: int = 2) -> str:
    """Markdown: modeled seconds a token on an RTX 4090 (PCIe 4.0 x16) with Llama-2-7B at ``context`` tokens, plain
    ``generate()`` with transformers' offloaded cache against TriForce offloaded at ``gamma2`` 6, 12 and 16 (level-1
    per-token ``acceptance``), beside the paper's measured 2,434 ms and 312 ms.

    Example:
        >>> "| 16 |" in cost_table(0.9)
        True
    """
    config = preset_config("llama2-7b", context)
    hbm, bus = RTX_4090[1:]
    plain = plain_offloaded_ms(config, context, dtype_bytes, bus)
    header = "| decoding | gamma2 | tokens / verification | ms / verification | ms drafting | ms a token | vs plain |"
    rows = [header, "|---|---:|---:|---:|---:|---:|---:|",
            f"| plain generate(), offloaded cache | - | 1 | {plain:,.0f} | - | {plain:,.0f} | 1.00x |"]  # fmt: skip
    for gamma2 in (6, 12, 16):
        tc = TriForceConfig(gamma2=gamma2)
        r = triforce_offloaded_round(config, context, dtype_bytes, tc, acceptance, hbm, bus)
        rows.append(f"| TriForce, offload_kv=True | {gamma2} | {r.tokens:.2f} | {r.verification_ms:,.0f} | "
                    f"{r.drafting_ms:,.0f} | {r.ms_per_token:,.0f} | {plain / r.ms_per_token:.2f}x |")  # fmt: skip
    return "\n".join(rows) + "\n"
