"""Loading the model the demo or the benchmark runs: the embedded SmolLM2, or a local directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..errors import TriForceError
from .smollm2 import load_smollm2


class ModelLoadError(TriForceError):
    """The model could not be loaded; the message says what to do."""


def load_model(
    path: str | None, attn_implementation: str = "sdpa", dtype: torch.dtype = torch.float32, **from_pretrained: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)``: SmolLM2-135M-Instruct when ``path`` is None, else ``from_pretrained(path)``.

    The model is in eval mode. Nothing is downloaded: ``path`` must be a local directory saved with
    ``save_pretrained()``.

    Args:
        path: a local model directory, or None for the embedded SmolLM2-135M-Instruct.
        attn_implementation: attention backend passed to ``from_pretrained``.
        dtype: the weights' dtype (float32 by default).
        from_pretrained: more ``from_pretrained`` arguments (e.g.
            :func:`hf_triforce.bench.sharding.sharded_loading_kwargs` under ``torchrun``).

    Raises:
        ModelLoadError: the path does not exist, holds no model, or the model cannot be loaded; the message
            says what to pass instead.

    Example:
        >>> model, tokenizer = load_model(None)  # doctest: +SKIP
        >>> model.config.model_type  # doctest: +SKIP
        'llama'
    """
    if path is None:
        try:
            return load_smollm2(dtype, attn_implementation=attn_implementation, **from_pretrained)
        except FileNotFoundError as err:
            raise ModelLoadError(str(err)) from None
    check_model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation=attn_implementation, **from_pretrained
        )
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not load a causal LM from {path}: {err}") from None
    return model.eval(), tokenizer


def check_model_path(path: str) -> None:
    """Raise :class:`ModelLoadError` unless ``path`` is a directory holding a ``config.json`` (or a file).

    Example:
        >>> check_model_path("/no/such/model")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_triforce.bench.loading.ModelLoadError: model path /no/such/model does not exist: ...
    """
    if not Path(path).expanduser().exists():
        raise ModelLoadError(
            f"model path {path} does not exist: pass a local directory saved with save_pretrained() "
            "(model hubs are not reachable here), or omit --model to use the embedded SmolLM2."
        )
    if Path(path).expanduser().is_dir() and not (Path(path).expanduser() / "config.json").is_file():
        raise ModelLoadError(
            f"{path} holds no config.json: pass a directory saved with model.save_pretrained() and "
            "tokenizer.save_pretrained()."
        )
