"""The one module that touches transformers internals, each use behind a version check.

* :func:`enable` opts a model instance in: ``model.generate(..., triforce_config=cfg)`` then routes
  through :func:`hf_triforce.decoding.triforce_decode` via ``generate(custom_generate=...)``.
* Query capture: chunk selection needs the current *query*, which a ``Cache`` never sees. A neutral
  attention function registered with ``AttentionInterface`` (and the matching mask function with
  ``AttentionMaskInterface``) records it and delegates to the model's own implementation; it is only
  switched on for the duration of TriForce's full-cache forwards.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import transformers
from packaging import version
from tqdm.auto import tqdm

from .errors import UnsupportedModelError
from .kernels.attention import gqa_sdpa_attention
from .kernels.linear import linear_forward
from .kernels.retrieval import triton_enabled
from .kernels.verification import MAX_ROWS, verify_attention

MIN_TRANSFORMERS = "5.17"
MAX_TRANSFORMERS = "6"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")
"""``config.model_type`` values that :func:`enable` accepts: decoder-only RoPE families, MHA or GQA."""
_CAPTURE_PREFIX = "hf_triforce_capture_"


def check_transformers_version(current: str | None = None) -> None:
    """Raise ``ImportError`` unless ``MIN_TRANSFORMERS <= transformers < MAX_TRANSFORMERS``."""
    current = current or transformers.__version__
    v = version.parse(current)
    if not version.parse(MIN_TRANSFORMERS) <= v < version.parse(MAX_TRANSFORMERS):
        raise ImportError(
            f"hf_triforce needs transformers>={MIN_TRANSFORMERS},<{MAX_TRANSFORMERS}; found {current}. "
            f"Run: pip install 'transformers>={MIN_TRANSFORMERS},<{MAX_TRANSFORMERS}'"
        )


check_transformers_version()

from transformers import AttentionInterface, StoppingCriteriaList, StopStringCriteria  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402


class QueryCapture:
    """Holds the post-RoPE queries of the last ``keep`` positions of a forward, per layer.

    Passed to the model as the ``triforce_capture`` kwarg of a forward inside :func:`capturing_queries`.

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


def _base_attention(base: str, module: torch.nn.Module) -> Callable:
    if base == "eager":
        modeling = sys.modules[type(module).__module__]
        if not hasattr(modeling, "eager_attention_forward"):
            raise UnsupportedModelError(f"{type(module).__name__} has no eager_attention_forward to delegate to.")
        return modeling.eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[base]


def _make_capturing_attention(base: str) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):
        capture = kwargs.pop("triforce_capture", None)
        if capture is not None:
            capture.store(module.layer_idx, query)
        if _use_split_kv(base, query, key, attention_mask, kwargs):
            return verify_attention(query, key, value, kwargs.get("scaling")).transpose(1, 2).contiguous(), None
        if _use_grouped_sdpa(base, query, key, attention_mask, kwargs):
            return gqa_sdpa_attention(module, query, key, value, attention_mask, **kwargs)
        # Show the base implementation its own name: flash attention looks its kernel up by
        # module.config._attn_implementation (lazy_import_flash_attention), which holds the capture name here.
        with _attn_implementation_as(module.config, base):
            return _base_attention(base, module)(module, query, key, value, attention_mask, **kwargs)

    return attention


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
    """No position bias, softcap or dropout: attention the fast paths compute exactly."""
    return kwargs.get("position_bias") is None and kwargs.get("softcap") is None and not kwargs.get("dropout")


def _use_grouped_sdpa(base: str, query: torch.Tensor, key: torch.Tensor, mask, kwargs: dict[str, Any]) -> bool:
    """Where transformers' sdpa would copy the cache into every query head (``repeat_kv``) on the CPU.

    That is a masked multi-token forward over a GQA cache: the full-cache verification of a draft.
    Single-token steps and the prefill keep transformers' own path (identical numerics to plain decoding).
    """
    plain = _plain_attention(kwargs)
    grouped = query.shape[1] != key.shape[1]
    on_cpu = query.device.type == "cpu"
    return base == "sdpa" and plain and grouped and on_cpu and mask is not None and query.shape[2] > 1


def _use_split_kv(base: str, query: torch.Tensor, key: torch.Tensor, mask, kwargs: dict[str, Any]) -> bool:
    """The full-cache verification on CUDA: the split-KV kernel (:mod:`~hf_triforce.kernels.verification`).

    Only inside :func:`capturing_queries` and :func:`view_attention` (TriForce's own verification and level-1
    forwards: batch 1, no padding, the new tokens' keys last), where the mask is bottom-right causal, which the
    kernel computes instead of reading.
    """
    plain = _plain_attention(kwargs) and kwargs.get("sliding_window") is None and query.shape[0] == 1
    rows = query.shape[2] * query.shape[1] // key.shape[1]  # a verification's few tokens, not a prefill chunk
    multi = mask is not None and query.shape[2] > 1 and rows <= MAX_ROWS
    return base == "sdpa" and plain and multi and triton_enabled(query, key)


_CAPTURE_NAMES: dict[str, str] = {}


def _capture_name(base: str) -> str:
    """Register (once) and return the neutral name of the capturing wrapper around ``base``."""
    if base not in _CAPTURE_NAMES:
        # Neutral names: transformers special-cases implementation names containing "sdpa" or "flash".
        name = f"{_CAPTURE_PREFIX}{len(_CAPTURE_NAMES)}"
        AttentionInterface.register(name, _make_capturing_attention(base))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        _CAPTURE_NAMES[base] = name
    return _CAPTURE_NAMES[base]


@contextlib.contextmanager
def capturing_queries(model: torch.nn.Module, capture: QueryCapture, keep: int) -> Iterator[dict[str, Any]]:
    """Within the block, forwards given the yielded kwargs record their last ``keep`` queries per layer."""
    capture.keep = keep
    with _attn_implementation_as(model.config, _capture_name(model.config._attn_implementation)):
        yield {"triforce_capture": capture}


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


@contextlib.contextmanager
def small_batch_linears(*models: torch.nn.Module | None) -> Iterator[None]:
    """Within the block, the models' ``nn.Linear`` layers use :func:`~hf_triforce.kernels.linear.linear_forward`.

    Multi-token forwards of a few rows (verification of drafts) then run at about the cost of a
    single-token step on the CPU. Layers wrapped by accelerate hooks, and subclasses of ``nn.Linear``
    (quantized layers), are left alone.
    """
    layers = {
        id(m): m
        for model in models
        if model is not None
        for m in model.modules()
        if type(m) is torch.nn.Linear and "forward" not in vars(m) and not hasattr(m, "_hf_hook")
    }.values()
    for layer in layers:
        layer.forward = functools.partial(linear_forward, layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


PROGRESS_MIN_TOKENS = 2048


def show_progress(prompt_tokens: int) -> bool:
    """Progress bars for prompts of at least ``PROGRESS_MIN_TOKENS``, unless transformers' are disabled."""
    return prompt_tokens >= PROGRESS_MIN_TOKENS and transformers.utils.logging.is_progress_bar_enabled()


@contextlib.contextmanager
def prefill_progress(model: torch.nn.Module, prompt_tokens: int) -> Iterator[None]:
    """A progress bar over the decoder layers during a one-forward prefill of a long prompt."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not show_progress(prompt_tokens):
        yield
        return
    bar = tqdm(total=len(layers), desc=f"TriForce prefill ({prompt_tokens} tokens)", unit="layer", leave=False)

    def advance(*_) -> None:  # a forward hook must return None, or it replaces the layer's output
        bar.update(1)

    handles = [layer.register_forward_hook(advance) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        bar.close()


def check_model_supported(model: torch.nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` unless ``model`` is a supported decoder-only RoPE family."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES or getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"hf_triforce does not support model_type={model_type!r}. Supported families: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (Llama 2/3.x, SmolLM, Mistral, Qwen2/2.5, Qwen3, Phi-3)."
        )
    base = config._attn_implementation
    if base != "eager" and base not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise UnsupportedModelError(
            f"attn_implementation={base!r} has no causal-mask function; load the model with "
            "attn_implementation='sdpa' or 'eager'."
        )


def rotary_inv_freq(model: torch.nn.Module) -> torch.Tensor:
    """The ``[head_dim // 2]`` (or partial) rotary inverse frequencies of a Llama-style model."""
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    if inv_freq is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no model.rotary_emb.inv_freq (RoPE) to re-rotate with."
        )
    return inv_freq.detach().float()


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the model's output embedding (the length of its logits)."""
    return model.get_output_embeddings().weight.shape[0]


def enable(model: torch.nn.Module) -> torch.nn.Module:
    """Opt a model instance in to TriForce: ``model.generate(..., triforce_config=cfg)``.

    Idempotent, per instance; ``generate()`` without ``triforce_config`` is unchanged. Pipelines work
    too: ``pipeline("text-generation", model=model, ...)(prompt, triforce_config=cfg)``.

    Args:
        model: a transformers causal LM of a supported family (see ``SUPPORTED_MODEL_TYPES``).

    Returns:
        the same model.

    Example:
        >>> hf_triforce.enable(model)  # doctest: +SKIP
        >>> out = model.generate(input_ids, max_new_tokens=64, triforce_config=TriForceConfig())  # doctest: +SKIP
    """
    check_model_supported(model)
    if getattr(model, "_hf_triforce_enabled", False):
        return model
    plain_generate = model.generate

    @functools.wraps(plain_generate)
    def generate(*args, triforce_config=None, **kwargs):
        from .decoding import prepare_triforce_call

        triforce_config = triforce_config or getattr(kwargs.get("generation_config"), "triforce_config", None)
        triforce_config = triforce_config or getattr(model.generation_config, "triforce_config", None)
        if triforce_config is None:
            return plain_generate(*args, **kwargs)
        _move_stop_strings(model, kwargs)
        kwargs["custom_generate"] = prepare_triforce_call(model, triforce_config, kwargs)
        return plain_generate(*args, **kwargs)

    model.generate = generate
    model.generation_config.triforce_config = None
    model._hf_triforce_enabled = True
    return model


def disable(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`enable`: ``generate()`` is the class's own again. Idempotent.

    Example:
        >>> hf_triforce.disable(model)  # doctest: +SKIP
    """
    if getattr(model, "_hf_triforce_enabled", False):
        del model.generate
        del model._hf_triforce_enabled
        model.__dict__.pop("_hf_triforce_last_stats", None)
        from .drafting.graphs import KEPT_RUNNER_ATTR  # (drafting imports this module)

        model.__dict__.pop(KEPT_RUNNER_ATTR, None)  # the kept level-1 runner: frees its view storage
        if hasattr(model.generation_config, "triforce_config"):
            del model.generation_config.triforce_config
    return model


def _move_stop_strings(model, kwargs: dict[str, Any]) -> None:
    """Turn ``stop_strings`` into a ``StopStringCriteria`` in ``kwargs["stopping_criteria"]``.

    ``generate(custom_generate=<callable>)`` keeps only the callable's own extra parameters, so the
    ``tokenizer`` that stop strings need never reaches ``_get_stopping_criteria`` (transformers 5.x).
    Building the criterion here gives the loop the exact stopping rule plain ``generate()`` uses.
    """
    config = kwargs.get("generation_config") or model.generation_config
    stop_strings = kwargs.pop("stop_strings", None) or config.stop_strings
    if stop_strings is None:
        return
    tokenizer = kwargs.pop("tokenizer", None)
    if tokenizer is None:
        raise ValueError("stop_strings need the tokenizer: pass tokenizer=<your tokenizer> to generate().")
    if config.stop_strings is not None:
        kwargs["generation_config"] = copy.deepcopy(config)
        kwargs["generation_config"].stop_strings = None
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer, stop_strings))
    kwargs["stopping_criteria"] = criteria
