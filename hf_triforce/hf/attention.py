"""Query capture and attention routing, through ``AttentionInterface``.

Chunk selection needs the current *query*, which a ``Cache`` never sees. A neutral attention function
registered with ``AttentionInterface`` (and the matching mask function with ``AttentionMaskInterface``)
records it and delegates to the model's own implementation; it is switched on (the model's
``config._attn_implementation`` renamed to it) only for the duration of TriForce's own forwards:
:func:`capturing_queries` around the full-cache forwards, :func:`view_attention` around level-1 forwards on CUDA.
What a forward should record or attend to travels in context variables set by those blocks, not in the forward's
kwargs: some decoder layers (StableLM's, say) do not pass their kwargs on to their attention.
On the way it routes the attention of a few new tokens over a long cache to hf_triforce's kernels where they
compute exactly the same thing faster (grouped SDPA on the CPU, split-KV on CUDA).
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
_ACTIVE_CAPTURE: contextvars.ContextVar[QueryCapture | None] = contextvars.ContextVar("triforce_capture", default=None)
"""The :class:`QueryCapture` of the forward in progress inside :func:`capturing_queries` (``None`` elsewhere)."""
_ACTIVE_SLOTS: contextvars.ContextVar[Any] = contextvars.ContextVar("triforce_slots", default=None)
"""The key-slot validity of the forward in progress inside :func:`slot_attention` (``None`` elsewhere)."""
_ACTIVE_TREE: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("triforce_tree", default=None)
"""The token-tree visibility of the forward in progress inside :func:`tree_attention` (``None`` elsewhere)."""
_ACTIVE_LENGTH: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("triforce_length", default=None)
"""The visible length (``[1]`` long, on the device) of the fixed-capacity cache, inside
:func:`fixed_capacity_attention`."""


class QueryCapture:
    """Holds the post-RoPE queries of the last ``keep`` positions of a forward, per layer.

    Filled by the forwards inside :func:`capturing_queries`.

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
        length = _ACTIVE_LENGTH.get()
        if _use_split_kv(base, query, key, attention_mask, kwargs, length is not None):
            out = verify_attention(query, key, value, kwargs.get("scaling"), length)
            return out.transpose(1, 2).contiguous(), None
        if _use_grouped_sdpa(base, query, key, attention_mask, kwargs):
            return gqa_sdpa_attention(module, query, key, value, attention_mask, **kwargs)
        # Show the base implementation its own name: flash attention looks its kernel up by
        # module.config._attn_implementation (lazy_import_flash_attention), which holds the capture name here.
        with _attn_implementation_as(module.config, base):
            return _base_attention(base, module)(module, query, key, value, attention_mask, **kwargs)

    return attention


def _slot_attention(base: str, slots: Any, module, query, key, value, **kwargs):
    """Attention of a batch's queries over the slots ``slots`` marks valid (and, in a sliding-window layer of the full
    cache, within each query's window as plain ``generate()`` counts it): plain attention through
    :func:`~hf_triforce.kernels.attention.masked_gqa_attention` (each key read once per KV head); anything else
    (soft-capping, learned sinks, a window) through the model's own implementation, given the slots as its mask."""
    valid = slots.for_layer(module.layer_idx)
    in_window = slots.in_window(kwargs.get("sliding_window"), query.shape[2])
    query_slots = getattr(slots, "query_slots", None)  # fixed-capacity storage: the step's own slots
    if _plain_attention(kwargs) and in_window is None:
        return masked_gqa_attention(query, key, value, valid, kwargs.get("scaling"), query_slots)
    mask = slot_attention_mask(valid, query.shape[2], in_window, query_slots)
    mask = mask.repeat_interleave(query.shape[1] // mask.shape[1], dim=1)  # per KV head -> per query head
    return _base_with_mask(base, module, query, key, value, mask, **kwargs)


def _tree_attention(base: str, rows: torch.Tensor, module, query, key, value, **kwargs):
    """Attention of a token tree's nodes (the forward's queries, the last of the tree's keys): every key before the
    tree, and within it each node's ancestors and itself (``rows`` ``[q, m]`` over the tree's ``m`` keys). Plain
    attention through :func:`~hf_triforce.kernels.attention.gqa_sdpa_attention` (each key read once per KV head);
    soft-capping or learned sinks through the model's own sdpa or eager attention, given that mask (the call's plan
    runs trees only where every layer attends in full)."""
    mask = tree_attention_mask(rows, key.shape[2])
    if _plain_attention(kwargs):
        return gqa_sdpa_attention(module, query, key, value, mask, scaling=kwargs.get("scaling"))
    return _base_with_mask(base, module, query, key, value, mask, **kwargs)


def _base_with_mask(base: str, module, query, key, value, mask: torch.Tensor, **kwargs):
    """The model's own sdpa or eager attention (the only ones the call's plan lets through here) with a bool
    ``mask`` (True: attend), additive for eager."""
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
    """No position bias, softcap, learned sinks (gpt-oss's ``s_aux``) or dropout: attention the fast paths compute
    exactly."""
    extras = ("position_bias", "softcap", "s_aux")
    return all(kwargs.get(name) is None for name in extras) and not kwargs.get("dropout")


def _use_grouped_sdpa(base: str, query: torch.Tensor, key: torch.Tensor, mask, kwargs: dict[str, Any]) -> bool:
    """Where transformers' sdpa would copy the cache into every query head (``repeat_kv``) on the CPU.

    That is a masked multi-token forward over a GQA cache: the full-cache verification of a draft.
    Single-token steps and the prefill keep transformers' own path (identical numerics to plain decoding).
    """
    plain = _plain_attention(kwargs)
    grouped = query.shape[1] != key.shape[1]
    on_cpu = query.device.type == "cpu"
    return base == "sdpa" and plain and grouped and on_cpu and mask is not None and query.shape[2] > 1


def _use_split_kv(
    base: str, query: torch.Tensor, key: torch.Tensor, mask, kwargs: dict[str, Any], fixed: bool = False
) -> bool:
    """The full-cache verification on CUDA: the split-KV kernel (:mod:`~hf_triforce.kernels.verification`).

    Only inside :func:`capturing_queries` and :func:`view_attention` (TriForce's own verification and level-1
    forwards: batch 1, no padding, the new tokens' keys last), where the mask is bottom-right causal, which the
    kernel computes instead of reading. ``fixed``: inside :func:`fixed_capacity_attention`, where the keys are a
    fixed-capacity storage and the kernel reads the visible length on the device (one-token steps too: the kernel is
    then the only thing that knows where the cache ends without the mask).
    """
    plain = _plain_attention(kwargs) and kwargs.get("sliding_window") is None and query.shape[0] == 1
    rows = query.shape[2] * query.shape[1] // key.shape[1]  # a verification's few tokens, not a prefill chunk
    multi = mask is not None and (query.shape[2] > 1 or fixed) and rows <= MAX_ROWS
    return base == "sdpa" and plain and multi and triton_enabled(query, key)


_CAPTURE_NAMES: dict[str, str] = {}


def _capture_name(base: str) -> str:
    """Register (once) and return the neutral name of the capturing wrapper around ``base`` (``base`` itself when it
    is such a wrapper already: the blocks nest, and the wrapper serves them all)."""
    if base in _CAPTURE_NAMES.values():
        return base
    if base not in _CAPTURE_NAMES:
        # Neutral names: transformers special-cases implementation names containing "sdpa" or "flash".
        name = f"{_CAPTURE_PREFIX}{len(_CAPTURE_NAMES)}"
        AttentionInterface.register(name, _make_capturing_attention(base))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        _CAPTURE_NAMES[base] = name
    return _CAPTURE_NAMES[base]


@contextlib.contextmanager
def _active(variable: contextvars.ContextVar, value: Any) -> Iterator[None]:
    """Within the block, ``variable`` holds ``value``; restored after."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)


@contextlib.contextmanager
def capturing_queries(model: torch.nn.Module, capture: QueryCapture, keep: int) -> Iterator[dict[str, Any]]:
    """Within the block, the model's forwards record their last ``keep`` queries per layer.

    Yields the kwargs to give those forwards (none today: the capture travels in a context variable, so it reaches
    the attention of decoder layers that do not pass their kwargs on).
    """
    capture.keep = keep
    with _attn_implementation_as(model.config, _capture_name(model.config._attn_implementation)):
        with _active(_ACTIVE_CAPTURE, capture):
            yield {}


@contextlib.contextmanager
def slot_attention(model: torch.nn.Module, slots: Any) -> Iterator[dict[str, Any]]:
    """Within the block, the model's forwards attend only to the key slots ``slots`` marks valid (yields the kwargs
    to give them: none, as for :func:`capturing_queries`).

    ``slots.for_layer(layer_idx)`` gives ``[B, 1 or H_kv, L]`` bool validity of the layer's keys (a batch's
    padding and the holes its ragged acceptance leaves, see :mod:`hf_triforce.caches.slots`) and
    ``slots.in_window(window, q)`` the ``[B, 1, q, L]`` keys within a sliding window (``None``: no window applies);
    the attention is :func:`~hf_triforce.kernels.attention.masked_gqa_attention`, or the model's own sdpa or eager
    attention with that mask where it soft-caps, has learned sinks or a window, whatever mask transformers built.
    """
    with _attn_implementation_as(model.config, _capture_name(model.config._attn_implementation)):
        with _active(_ACTIVE_SLOTS, slots):
            yield {}


@contextlib.contextmanager
def tree_attention(model: torch.nn.Module, rows: torch.Tensor) -> Iterator[dict[str, Any]]:
    """Within the block, the model's forwards are token-tree steps: their ``q`` queries are the last ``q`` of the
    tree's ``m`` keys (the last ``m`` of the cache's), and query ``i`` sees every key before the tree and the tree's
    keys where ``rows[i]`` (``[q, m]`` bool: its ancestors and itself) is ``True``. Yields the forwards' kwargs
    (none, as for :func:`capturing_queries`); nests with it.

    Example:
        >>> rows = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])
        >>> with tree_attention(model, rows):  # root, then two candidates after it  # doctest: +SKIP
        ...     model(input_ids=ids, position_ids=torch.tensor([[9, 10, 10]]), past_key_values=cache)
    """
    with _attn_implementation_as(model.config, _capture_name(model.config._attn_implementation)):
        with _active(_ACTIVE_TREE, rows):
            yield {}


@contextlib.contextmanager
def fixed_capacity_attention(model: torch.nn.Module, length: torch.Tensor) -> Iterator[None]:
    """Within the block, the model's forwards attend over a fixed-capacity full cache whose first ``length`` slots
    (``[1]`` long, on the device; the forward's own tokens last among them) are its tokens.

    The forward is given the exact mask over every slot, which the CPU paths read (grouped sdpa, or the model's own
    attention); on CUDA with Triton, plain attention goes through the split-KV kernel reading ``length`` on the
    device, so neither the unused capacity nor the mask is read, and no host read happens (a CUDA graph can hold
    the forward). Nests inside :func:`capturing_queries`.
    """
    with _attn_implementation_as(model.config, _capture_name(model.config._attn_implementation)):
        with _active(_ACTIVE_LENGTH, length):
            yield


@contextlib.contextmanager
def view_attention(model: torch.nn.Module) -> Iterator[None]:
    """Level-1 forwards over a dynamic retrieval view: on CUDA with Triton, through the same wrapper as the
    verification, so a multi-token step's attention reads a GQA view once (the split-KV kernel) instead of
    transformers' masked sdpa copying it per query head. Elsewhere transformers' attention, unchanged."""
    parameter = next(model.parameters(), None)
    if parameter is None or not triton_enabled(parameter):
        yield
        return
    with _attn_implementation_as(model.config, _capture_name(model.config._attn_implementation)):
        yield
