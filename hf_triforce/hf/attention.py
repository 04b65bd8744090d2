"""Query capture and attention routing through ``AttentionInterface``, inside TriForce's own forwards only.

A neutral attention function (``config._attn_implementation`` renamed to it within the blocks below) records the
queries chunk selection needs (a ``Cache`` never sees them) and delegates to the model's own implementation, or to
hf_triforce's exact kernels for a few tokens over a long cache. What it records or attends with travels in context
variables, not kwargs: some decoder layers (StableLM's) do not pass their kwargs on to their attention.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import UnsupportedModelError
from ..kernels.attention import gqa_sdpa_attention, masked_gqa_attention, slot_attention_mask, tree_attention_mask
from ..kernels.dispatch import triton_enabled
from ..kernels.verification import MAX_ROWS, verify_attention

_CAPTURE_PREFIX = "hf_triforce_capture_"
# Set by the blocks below for the forward in progress (None outside them).
_ACTIVE_CAPTURE: contextvars.ContextVar[QueryCapture | None] = contextvars.ContextVar("triforce_capture", default=None)
_ACTIVE_SLOTS: contextvars.ContextVar[Any] = contextvars.ContextVar("triforce_slots", default=None)
_ACTIVE_TREE: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("triforce_tree", default=None)


class QueryCapture:
    """Post-RoPE queries of a forward's last ``keep`` positions, per layer (filled in :func:`capturing_queries`).

    Example:
        >>> cap = QueryCapture(); cap.store(0, torch.randn(1, 4, 3, 8))
        >>> cap.at(-1)[0].shape
        torch.Size([1, 4, 8])
    """

    def __init__(self) -> None:
        self.queries: dict[int, torch.Tensor] = {}
        self.keep = 1

    def store(self, layer_idx: int, query: torch.Tensor) -> None:
        self.queries[layer_idx] = query[:, :, -self.keep :].detach().clone()

    def at(self, index: int) -> list[torch.Tensor]:
        """Per-layer ``[B, H_q, D]`` query at ``index`` of the kept positions."""
        return [self.queries[i][:, :, index] for i in sorted(self.queries)]

    def rows_at(self, positions: list[int]) -> list[torch.Tensor]:
        """Per-layer ``[B, H_q, D]`` queries, row ``b``'s at its kept position ``positions[b]``.

        Example:
            >>> cap = QueryCapture(); cap.keep = 3; cap.store(0, torch.arange(6.0).view(2, 1, 3, 1))
            >>> cap.rows_at([2, 0])[0].flatten().tolist()
            [2.0, 3.0]
        """
        index = torch.tensor(positions, device=self.queries[0].device)
        rows = torch.arange(index.shape[0], device=index.device)
        return [self.queries[i][rows, :, index] for i in sorted(self.queries)]


def _base_attention(base: str, module: torch.nn.Module) -> Callable:
    if base == "eager":
        modeling = sys.modules[type(module).__module__]
        if not hasattr(modeling, "eager_attention_forward"):
            raise UnsupportedModelError(f"{type(module).__name__} has no eager_attention_forward to delegate to.")
        return modeling.eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[base]


def _make_capturing_attention(base: str) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):
        capture = _ACTIVE_CAPTURE.get()
        if capture is not None:
            capture.store(module.layer_idx, query)
        tree = _ACTIVE_TREE.get()
        if tree is not None:  # a token tree: each node sees its ancestors, not its cousins
            return _tree_attention(base, tree, module, query, key, value, **kwargs)
        slots = _ACTIVE_SLOTS.get()
        if slots is not None:  # a batch: padding and holes come from the slots, not transformers' mask
            return _slot_attention(base, slots, module, query, key, value, **kwargs)
        if _use_split_kv(base, query, key, attention_mask, kwargs):
            out = verify_attention(query, key, value, kwargs.get("scaling"))
            return out.transpose(1, 2).contiguous(), None
        if _use_grouped_sdpa(base, query, key, attention_mask, kwargs):
            return gqa_sdpa_attention(module, query, key, value, attention_mask, **kwargs)
        # flash attention looks its kernel up by config._attn_implementation (lazy_import_flash_attention)
        with _attn_implementation_as(module.config, base):
            return _base_attention(base, module)(module, query, key, value, attention_mask, **kwargs)

    return attention


def _slot_attention(base: str, slots: Any, module, query, key, value, **kwargs):
    """A batch's attention over the valid slots (see :func:`slot_attention`): plain attention through
    :func:`~hf_triforce.kernels.attention.masked_gqa_attention`, anything else through the model's own."""
    valid = slots.for_layer(module.layer_idx)
    in_window = slots.in_window(module.layer_idx, kwargs.get("sliding_window"), query.shape[2])
    query_slots = getattr(slots, "query_slots", None)  # fixed-capacity storage: the step's own slots
    if _plain_attention(kwargs) and in_window is None:
        return masked_gqa_attention(query, key, value, valid, kwargs.get("scaling"), query_slots)
    mask = slot_attention_mask(valid, query.shape[2], in_window, query_slots)
    mask = mask.repeat_interleave(query.shape[1] // mask.shape[1], dim=1)  # per KV head -> per query head
    return _base_with_mask(base, module, query, key, value, mask, **kwargs)


def _tree_attention(base: str, rows: torch.Tensor, module, query, key, value, **kwargs):
    """A token tree's attention (see :func:`tree_attention`): plain attention through
    :func:`~hf_triforce.kernels.attention.gqa_sdpa_attention`, soft-capping or sinks through the model's own."""
    mask = tree_attention_mask(rows, key.shape[2], kwargs.get("sliding_window"))
    if _plain_attention(kwargs):
        return gqa_sdpa_attention(module, query, key, value, mask, scaling=kwargs.get("scaling"))
    return _base_with_mask(base, module, query, key, value, mask, **kwargs)


def _base_with_mask(base: str, module, query, key, value, mask: torch.Tensor, **kwargs):
    """The model's own sdpa or eager attention with a bool ``mask`` (True: attend), made additive for eager."""
    if base == "eager":
        mask = torch.where(mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
    with _attn_implementation_as(module.config, base):
        return _base_attention(base, module)(module, query, key, value, mask, **kwargs)


def active_tree_mask(kv_len: int) -> torch.Tensor | None:
    """``[1, 1, q, kv_len]`` bool mask of the token tree whose forward is in progress (:func:`tree_attention`), or
    ``None`` outside one: what level 1's direct forward attends with."""
    rows = _ACTIVE_TREE.get()
    return None if rows is None else tree_attention_mask(rows, kv_len)


@contextlib.contextmanager
def _attn_implementation_as(config, name: str) -> Iterator[None]:
    """Within the block, ``config._attn_implementation`` is ``name``; restored after."""
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous


def _plain_attention(kwargs: dict[str, Any]) -> bool:
    """No position bias, softcap, learned sinks (gpt-oss's ``s_aux``) or dropout: the fast paths are exact."""
    extras = ("position_bias", "softcap", "s_aux")
    return all(kwargs.get(name) is None for name in extras) and not kwargs.get("dropout")


def _use_grouped_sdpa(base: str, query: torch.Tensor, key: torch.Tensor, mask, kwargs: dict[str, Any]) -> bool:
    """A masked multi-token sdpa forward over a GQA cache on the CPU, where transformers would ``repeat_kv``
    (single-token steps keep transformers' path: the same numerics as plain decoding)."""
    plain = _plain_attention(kwargs)
    grouped = query.shape[1] != key.shape[1]
    on_cpu = query.device.type == "cpu"
    return base == "sdpa" and plain and grouped and on_cpu and mask is not None and query.shape[2] > 1


def _use_split_kv(base: str, query: torch.Tensor, key: torch.Tensor, mask, kwargs: dict[str, Any]) -> bool:
    """Route to the split-KV kernel on CUDA with Triton, or its CPU counterpart (key ranges as one SDPA call): only
    TriForce's own forwards get here (batch 1, no padding, new keys last: the mask is bottom-right causal)."""
    plain = _plain_attention(kwargs) and kwargs.get("sliding_window") is None and query.shape[0] == 1
    rows = query.shape[2] * query.shape[1] // key.shape[1]  # a verification's few tokens, not a prefill chunk
    multi = mask is not None and query.shape[2] > 1 and rows <= MAX_ROWS
    return base == "sdpa" and plain and multi and (query.device.type == "cpu" or triton_enabled(query, key))


_CAPTURE_NAMES: dict[str, str] = {}


def _capture_name(base: str) -> str:
    """The neutral name of the capturing wrapper around ``base``, registered once (``base`` itself if a wrapper)."""
    if base in _CAPTURE_NAMES.values():
        return base
    if base not in _CAPTURE_NAMES:
        # Neutral names: transformers special-cases implementation names containing "sdpa" or "flash".
        name = f"{_CAPTURE_PREFIX}{len(_CAPTURE_NAMES)}"
        AttentionInterface.register(name, _make_capturing_attention(base))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        _CAPTURE_NAMES[base] = name
    return _CAPTURE_NAMES[base]


Routing = contextlib.AbstractContextManager[dict[str, Any]]  # a block of routed attention (it yields no kwargs)


@contextlib.contextmanager
def _routed(model: torch.nn.Module, variable: contextvars.ContextVar | None = None, value: Any = None) -> Iterator:
    """Within the block, ``model``'s attention goes through the capturing wrapper, ``variable`` holding ``value``
    (restored after); yields no kwargs."""
    token = None if variable is None else variable.set(value)
    try:
        with _attn_implementation_as(model.config, _capture_name(model.config._attn_implementation)):
            yield {}
    finally:
        if token is not None:
            variable.reset(token)


def capturing_queries(model: torch.nn.Module, capture: QueryCapture, keep: int) -> Routing:
    """Within the block, the model's forwards record their last ``keep`` queries per layer (yields no kwargs)."""
    capture.keep = keep
    return _routed(model, _ACTIVE_CAPTURE, capture)


def slot_attention(model: torch.nn.Module, slots: Any) -> Routing:
    """Within the block, the model's forwards attend only to the key slots ``slots`` marks valid (yields no kwargs).

    ``slots.for_layer(layer_idx)``: ``[B, 1 or H_kv, L]`` bool validity of the layer's ``L`` keys (padding and holes,
    see :mod:`hf_triforce.caches.slots`); ``slots.in_window(layer_idx, window, q)``: ``[B, 1, q, L]`` keys within a
    sliding window (``None``: no window). Transformers' own mask is ignored.
    """
    return _routed(model, _ACTIVE_SLOTS, slots)


def tree_attention(model: torch.nn.Module, rows: torch.Tensor) -> Routing:
    """Within the block, the forwards are token-tree steps over the cache's last ``m`` keys (yields no kwargs).

    Query ``i`` sees every key before the tree and the tree's keys where ``rows[i]`` (``[q, m]`` bool: its ancestors
    and itself) is ``True``; in a sliding layer only those within its window
    (:func:`~hf_triforce.kernels.attention.tree_attention_mask`).

    Example:
        >>> rows = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])
        >>> with tree_attention(model, rows):  # root, then two candidates after it  # doctest: +SKIP
        ...     model(input_ids=ids, position_ids=torch.tensor([[9, 10, 10]]), past_key_values=cache)
    """
    return _routed(model, _ACTIVE_TREE, rows)


def view_attention(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Level-1 forwards over a dynamic view: through the split-KV kernel on CUDA with Triton, else unchanged."""
    parameter = next(model.parameters(), None)
    return _routed(model) if parameter is not None and triton_enabled(parameter) else contextlib.nullcontext()
