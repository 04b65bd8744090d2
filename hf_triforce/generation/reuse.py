"""Starting a TriForce call from a cache the caller prefilled (prefilling only ``input_ids[:, cached:]``, as plain
``generate()``), and handing the grown cache back: a returned RetrievalCache is used in place, a DynamicCache copied."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..caches.retrieval import RetrievalCache
from ..config import TriForceConfig
from ..hf.caches import describe, plain_kv_layers, set_window_layer
from ..hf.model import is_dispatched, kv_shape, layer_windows, num_layers


@dataclass
class StartingCache:
    """The full cache a call decodes into, and what becomes of the caller's cache."""

    cache: RetrievalCache
    reused: int  # tokens already in cache when the call starts (the caller's prefix)
    callers: Any | None  # the caller's cache when it was copied (the new tokens are appended to it at the end)
    returned: Any  # the cache the output carries


def start_cache(
    model: torch.nn.Module, config: TriForceConfig, input_ids: torch.LongTensor, max_length: int, callers: Any | None,
    batched: bool = False,
) -> StartingCache:  # fmt: skip
    """The full cache for a call over ``input_ids`` ``[B, n]``, from the caller's checked cache when given.

    A batched call copies the caller's cache (one row per row, or one row all share) and leaves it as it was: plain
    ``generate()`` would append the padding it feeds finished rows, which TriForce never computes. It returns no cache.
    """
    capacity = config.full_cache_capacity(max_length)
    offload_to = next(model.parameters()).device if config.offload_kv else None
    windows = layer_windows(model)
    if callers is None:
        cache = _new_cache(model, config, capacity, offload_to, windows)
        return StartingCache(cache, 0, None, None if batched else cache)
    reused = callers.get_seq_length() if _layouts(callers) else 0
    # a layer the caller's cache keeps whole stays whole (its tokens are handed back); a sliding one keeps its window
    kinds = [getattr(layer, "is_sliding", False) for layer in callers.layers]
    windows = [w if i < len(kinds) and kinds[i] else None for i, w in enumerate(windows)]
    offloaded = isinstance(callers, RetrievalCache) and callers.transfers is not None
    same_layout = isinstance(callers, RetrievalCache) and callers.chunk_size == config.chunk_size
    if not batched and same_layout and offloaded == config.offload_kv:
        for layer in callers.layers:
            if layer.is_initialized and not layer.is_sliding:
                layer.buffer.reserve(capacity, layer.buffer.like())
        return StartingCache(callers, reused, None, callers)
    cache = _new_cache(model, config, capacity, offload_to, windows)
    rows = input_ids.shape[0]  # a batch: one cached row per row, or one every row shares (one row: as it is)
    for i, (keys, values, length) in _key_values(callers):
        cache.load(i, keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), length)
    copied = None if batched else callers
    return StartingCache(cache, reused, copied, copied)


def _new_cache(model, config: TriForceConfig, capacity: int, offload_to, windows: list[int | None]) -> RetrievalCache:
    """A full cache whose sliding layers keep their window and one round: room for ``gamma1 + gamma2`` drafts and the
    token before them (a larger token tree grows a sliding layer's storage to exactly its window and that tree)."""
    round_slots = config.gamma1 + config.gamma2 + 1
    return RetrievalCache(num_layers(model), config.chunk_size, capacity, offload_to, windows, round_slots)


def hand_back(start: StartingCache) -> Any:
    """Append the call's new tokens to a copied caller's cache (a sliding layer takes the window the call ends with);
    returns the cache the output carries."""
    if start.callers is not None:
        for i, layer in enumerate(start.cache.layers):
            if layer.is_sliding:
                keys, values = (t.clone() for t in layer.read_from(layer.start))
                theirs = start.callers.layers[i]
                if isinstance(start.callers, RetrievalCache):  # another layout of ours: loaded afresh
                    theirs.reset()
                    theirs.load(keys, values, layer.get_seq_length())
                else:
                    set_window_layer(theirs, keys, values, layer.get_seq_length())
            else:
                keys, values = layer.read_from(start.reused)
                start.callers.update(keys, values, i)
    return start.returned


def _key_values(cache: Any) -> list[tuple[int, tuple[torch.Tensor, torch.Tensor, int]]]:
    """Per initialized layer ``(index, ([B, H_kv, S, D] keys, values, length))``: the ``S`` tokens it holds of the
    ``length`` it has seen (a DynamicCache's or RetrievalCache's; a sliding layer holds the last ones)."""
    ours = isinstance(cache, RetrievalCache)
    return [
        (i, (*(layer.read_from(layer.start) if ours else (layer.keys, layer.values)), layer.get_seq_length()))
        for i, layer in enumerate(cache.layers)
        if layer.is_initialized
    ]


def _layouts(cache: Any) -> list[tuple[torch.Tensor, int]]:
    """Per initialized layer, ``(a tensor with its keys' shape, dtype and device, its length)``, read no keys."""
    if isinstance(cache, RetrievalCache):
        return [(layer.buffer.like(), layer.get_seq_length()) for layer in cache.layers if layer.is_initialized]
    return [(layer.keys, layer.get_seq_length()) for layer in cache.layers if layer.is_initialized]


def callers_cache_problem(model: torch.nn.Module, cache: Any | None, input_shape: torch.Size) -> str | None:
    """Why a call over ``input_shape`` ``(rows, tokens)`` cannot start from the caller's ``cache`` (``None``: can)."""
    if cache is None:
        return None
    rows, input_length = input_shape
    windows = layer_windows(model)
    if not (isinstance(cache, RetrievalCache) or plain_kv_layers(cache, windows)):
        return (
            f"it is a {describe(cache)}, and TriForce needs the plain key/value tensors of every cached token of a "
            "full-attention layer and of the window of a sliding one, in memory (DynamicCache(config=model.config) "
            "or DynamicCache())"
        )
    if isinstance(cache, RetrievalCache):
        other = [i for i, layer in enumerate(cache.layers) if layer.is_sliding and layer.window != windows[i]]
        if len(cache.layers) == len(windows) and other:
            return f"its sliding layers {other} have other windows than the model's (it was made for another model)"
    layouts = _layouts(cache)
    cached = cache.get_seq_length() if layouts else 0
    problem = _other_model(model, layouts, rows) if layouts else None
    if problem is None and cached > input_length - 1:
        problem = (
            f"it holds {cached} tokens and input_ids has {input_length}: as in plain generate(), input_ids must be "
            "the cached tokens followed by at least one new one (pass the whole sequence)"
        )
    return problem


def _other_model(model: torch.nn.Module, layouts: list[tuple[torch.Tensor, int]], rows: int) -> str | None:
    layers, (kv_heads, head_dim) = num_layers(model), kv_shape(model)
    parameter = next(model.parameters())
    problems = []
    if len(layouts) != layers:
        problems.append(f"{len(layouts)} layers of keys/values, the model has {layers}")
    shapes = {(k.shape[1], k.shape[3]) for k, _ in layouts}
    if shapes != {(kv_heads, head_dim)}:
        problems.append(f"(KV heads, head dim) {sorted(shapes)}, the model has {(kv_heads, head_dim)}")
    batches = {k.shape[0] for k, _ in layouts}
    if len(batches) != 1 or not batches <= {1, rows}:
        problems.append(f"a batch of {sorted(batches)} sequences, the call has {rows} (the cache holds one row per row "
                        "of input_ids, or one row every row shares)")  # fmt: skip
    if len({length for _, length in layouts}) != 1:
        problems.append("layers of different lengths")
    keys = layouts[0][0]
    if is_dispatched(model):  # keys live on each layer's execution device, weights maybe on meta
        if {k.dtype for k, _ in layouts} != {parameter.dtype}:
            problems.append(f"keys in {keys.dtype}, the model is {parameter.dtype}")
    elif {(k.dtype, k.device) for k, _ in layouts} != {(parameter.dtype, parameter.device)}:
        problems.append(f"keys in {keys.dtype} on {keys.device}, the model is {parameter.dtype} on {parameter.device}")
    if problems:
        return f"it holds {'; '.join(problems)} (it was made by another model or configuration)"
    return None
