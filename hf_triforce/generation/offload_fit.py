"""Whether an offloaded call fits, checked before any work: the host holds the full-attention layers; the device the
two layers a forward streams, the chunk means, the retrieval view and the sliding-window layers."""

from __future__ import annotations

import os

import torch

from ..config import TriForceConfig
from ..hf.model import kv_shape, layer_windows


def offload_fit_problem(model: torch.nn.Module, config: TriForceConfig, rows: int, max_length: int) -> str | None:
    """Why ``rows`` offloaded caches of ``max_length`` tokens do not fit host or device memory (with the longest
    ``max_length`` that does); ``None`` when they fit."""
    windows, (kv_heads, head_dim) = layer_windows(model), kv_shape(model)
    full, itemsize = sum(w is None for w in windows), next(model.parameters()).element_size()
    per_layer = 2 * kv_heads * head_dim * itemsize * rows  # bytes per slot of one layer's keys and values
    per_token = full * per_layer  # host: every full layer's; device: two layers' streamed, the full layers' chunk means
    device_per_slot = (2 * per_layer if full else 0) + full * per_layer // 2 // config.chunk_size
    round_slots = config.gamma1 + config.gamma2 + 1
    sliding = sum(w - 1 + round_slots for w in windows if w is not None) * per_layer  # SlidingLayer storage
    views = (config.retrieval_budget + config.view_extra_capacity) * per_layer * len(windows)  # one, reused
    limits = {"host memory": (host_available_bytes(), per_token, 0)}
    free = device_free_bytes(next(model.parameters()).device)
    if free is not None:
        limits["free device memory"] = (free, device_per_slot, views + sliding)
    capacity = config.full_cache_capacity(max_length)
    for where, (available, per_slot, fixed) in limits.items():
        if capacity * per_slot + fixed > available:
            return (
                f"it needs {(capacity * per_slot + fixed) / 2**30:.1f} GiB of {where} for {rows} row(s) of "
                f"{max_length} tokens, and {available / 2**30:.1f} GiB are available: the longest that fits is "
                f"max_length={_longest(config, available, per_slot, fixed)}"
            )
    return None


def _longest(config: TriForceConfig, available: int, per_slot: int, fixed: int) -> int:
    if per_slot == 0:  # nothing grows with the context (every layer slides)
        return 1 << 62
    slots = max(0, available - fixed) // per_slot
    whole = slots // config.chunk_size * config.chunk_size
    return max(0, whole - config.gamma2 - 2)


def host_available_bytes() -> int:
    """The host's available physical memory (huge where the OS does not say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def device_free_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device, or ``None`` elsewhere (the host check covers it)."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0]
