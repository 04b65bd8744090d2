"""The plain (non-speculative) decoding configurations a transformers user can choose, as ``generate()`` calls.

The bench's baseline, "best plain", is the fastest of them on the device. ``sdpa_flash`` allows PyTorch's flash
kernel only (an error, not a silent fallback, where it cannot run).

Example:
    >>> [v.name for v in PLAIN_DECODINGS]
    ['dynamic', 'static', 'static_compiled', 'sdpa_flash', 'flash_attention_2', 'continuous_batching']
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import Cache, CompileConfig, DynamicCache, GenerationConfig, StaticCache

from ..errors import InvalidInputError
from ..hf.model import attn_implementation
from ..hf.versions import cache_kwargs, compile_on_any_device, flash_attention_available


class PlainDecodingUnavailable(RuntimeError):
    """This plain decoding cannot run here (device, installed package, model); the message says why."""


@dataclass(frozen=True)
class PlainDecoding:
    """One plain decoding configuration.

    Attributes:
        description: what a user would write to get it.
        cache: ``"dynamic"``, ``"static"``, or ``None`` for ``generate_batch()``'s own paged cache.
        compiled: ``torch.compile`` through ``generate()``'s ``compile_config``.
    """

    name: str
    description: str
    cache: str | None
    compiled: bool = False
    cuda_only: bool = False
    _context: Callable[[Any], contextlib.AbstractContextManager] = lambda model: contextlib.nullcontext()

    def check(self, model) -> None:
        """Raise :class:`PlainDecodingUnavailable` where this configuration cannot run on ``model``."""
        if self.cuda_only and model.device.type != "cuda":
            raise PlainDecodingUnavailable(f"{self.name} is measured on CUDA only (the model is on {model.device}).")
        if self.name == "flash_attention_2" and not flash_attention_available(2):
            raise PlainDecodingUnavailable("flash_attention_2 needs the flash_attn package (pip install flash-attn).")
        if self.compiled and model.device.type != "cuda" and not _can_force_compile():
            raise PlainDecodingUnavailable("this transformers release has no CompileConfig._compile_all_devices.")

    def generate_kwargs(self, model, cache: Cache | None) -> dict[str, Any]:
        """``generate()`` arguments decoding into ``cache`` (prefilled, of kind :attr:`cache`; ``None``: a new one)."""
        kwargs: dict[str, Any] = {} if cache is None else cache_kwargs(cache)
        if cache is None and self.cache == "static":
            kwargs["cache_implementation"] = "static"
        if self.compiled:
            kwargs["compile_config"] = compile_config(model.device)
        elif self.cache == "static":
            kwargs["disable_compile"] = True  # on CUDA generate() compiles a static cache's forward by itself
        return kwargs

    @contextlib.contextmanager
    def active(self, model) -> Iterator[None]:
        """Around the call: the model switched into this configuration (and back afterwards)."""
        self.check(model)
        with self._context(model):
            yield


def _can_force_compile() -> bool:
    return compile_on_any_device(CompileConfig()) is not None


def compile_config(device: torch.device) -> CompileConfig:
    """A ``CompileConfig`` ``generate()`` honours on ``device`` (CPU too: mode ``"default"``, not CUDA graphs).

    Example:
        >>> compile_config(torch.device("cpu")).mode
        'default'
    """
    if device.type == "cuda":
        return CompileConfig()
    return compile_on_any_device(CompileConfig(mode="default"))


@contextlib.contextmanager
def _sdpa_flash(model) -> Iterator[None]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if attn_implementation(model) != "sdpa":
        raise PlainDecodingUnavailable(f"sdpa_flash needs an sdpa model, not {attn_implementation(model)}.")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        yield


@contextlib.contextmanager
def _attention(model, implementation: str) -> Iterator[None]:
    before = attn_implementation(model)
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


PLAIN_DECODINGS: tuple[PlainDecoding, ...] = (
    PlainDecoding("dynamic", "generate() (DynamicCache)", "dynamic"),
    PlainDecoding("static", 'generate(cache_implementation="static", disable_compile=True)', "static"),
    PlainDecoding(
        "static_compiled",
        'generate(cache_implementation="static", compile_config=CompileConfig(...))',
        "static",
        compiled=True,
    ),  # fmt: skip
    PlainDecoding(
        "sdpa_flash",
        "generate() under sdpa_kernel(SDPBackend.FLASH_ATTENTION)",
        "dynamic",
        cuda_only=True,
        _context=_sdpa_flash,
    ),  # fmt: skip
    PlainDecoding(
        "flash_attention_2",
        'model.set_attn_implementation("flash_attention_2"); generate()',
        "dynamic",
        cuda_only=True,
        _context=lambda model: _attention(model, "flash_attention_2"),
    ),  # fmt: skip
    PlainDecoding("continuous_batching", "generate_batch([prompt]) (paged attention)", None, cuda_only=True),
)
"""Every plain decoding configuration, in the bench's order."""


def prefilled_cache(
    model, prefix_ids: torch.LongTensor, kind: str, max_cache_len: int, chunk_size: int | None = None
) -> Cache:
    """A cache of ``kind`` (``"dynamic"`` or ``"static"``) holding ``prefix_ids`` ``[1, n]``.

    A static cache holds ``max_cache_len`` positions (round it up: similar lengths then share a compiled graph).
    ``chunk_size``: tokens per prefill forward (default: all).

    Example:
        >>> cache = prefilled_cache(model, ids[:, :-1], "static", 8192)  # doctest: +SKIP
        >>> model.generate(ids, max_new_tokens=64, **cache_kwargs(cache))  # doctest: +SKIP
    """
    if kind == "static":
        cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    elif kind == "dynamic":
        cache = DynamicCache(config=model.config)
    else:
        raise InvalidInputError(f"kind={kind!r}: 'dynamic' or 'static'.")
    n = prefix_ids.shape[1]
    step = chunk_size or n
    with torch.inference_mode():
        for start in range(0, n, step):
            positions = torch.arange(start, min(start + step, n), device=prefix_ids.device)
            model(input_ids=prefix_ids[:, positions], use_cache=True, cache_position=positions, logits_to_keep=1,
                  **cache_kwargs(cache))  # fmt: skip
    return cache


def plain_decoding(name: str) -> PlainDecoding:
    """The configuration of :data:`PLAIN_DECODINGS` called ``name``.

    Raises:
        ValueError: no such configuration (the message lists the names).

    Example:
        >>> plain_decoding("static").cuda_only
        False
    """
    for decoding in PLAIN_DECODINGS:
        if decoding.name == name:
            return decoding
    raise InvalidInputError(f"unknown plain decoding {name!r}: choose from {[d.name for d in PLAIN_DECODINGS]}.")


def generate_batch_one(model, input_ids: torch.LongTensor, **generate_kwargs) -> tuple[torch.LongTensor, list[float]]:
    """One request through ``model.generate_batch``: ``([1, prompt + new] ids, per-token timestamps in seconds)``.

    Example:
        >>> ids, times = generate_batch_one(model, prompt, max_new_tokens=64)  # doctest: +SKIP
    """
    kwargs = dict(generate_kwargs)
    new_tokens = kwargs.pop("max_new_tokens")
    kwargs.pop("streamer", None)
    config = GenerationConfig(**{**model.generation_config.to_dict(), **kwargs})
    outputs = model.generate_batch(
        inputs=[input_ids[0].tolist()], generation_config=config, max_new_tokens=new_tokens, record_timestamps=True
    )
    (output,) = outputs.values()
    new = torch.tensor(output.generated_tokens, dtype=input_ids.dtype, device=input_ids.device)[None]
    return torch.cat([input_ids, new], dim=1), list(getattr(output, "timestamps", None) or [])
