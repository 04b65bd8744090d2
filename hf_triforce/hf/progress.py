"""Progress bars for long prefills, following transformers' own switch for progress bars, and that switch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from tqdm.auto import tqdm
from transformers.utils import logging as hf_logging

from .model import decoder_layers

PROGRESS_MIN_TOKENS = 2048


def quiet_transformers() -> None:
    """Switch off transformers' progress bars (and so the prefill bars) and its messages below errors: ranks > 0."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def show_progress(prompt_tokens: int) -> bool:
    """Progress bars for prompts of at least ``PROGRESS_MIN_TOKENS``, unless transformers' are disabled."""
    return prompt_tokens >= PROGRESS_MIN_TOKENS and hf_logging.is_progress_bar_enabled()


@contextlib.contextmanager
def prefill_progress(model: torch.nn.Module, prompt_tokens: int) -> Iterator[None]:
    """A progress bar over the decoder layers during a one-forward prefill of a long prompt."""
    layers = decoder_layers(model)
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
