"""A model's config read from a local directory or ``config.json``, without downloading anything.

Example:
    >>> import tempfile
    >>> from transformers import LlamaConfig
    >>> folder = tempfile.mkdtemp()
    >>> LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4).save_pretrained(folder)
    >>> load_local_config(folder).num_hidden_layers, load_local_config(folder + "/config.json").hidden_size
    (2, 64)
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from ..errors import InvalidInputError


def load_local_config(path: str | Path) -> PretrainedConfig:
    """The transformers config of the model at ``path``: a directory holding ``config.json``, or that file.

    A ``model_type`` transformers does not know (a ``trust_remote_code`` model) is read as a generic
    ``PretrainedConfig``: the shape fields the estimate reads keep their usual names.

    Raises:
        InvalidInputError: ``path`` is neither (a Hub id is refused: nothing is downloaded), or is not a config.
    """
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise InvalidInputError(
            f"--model {str(path)!r}: no local directory with a config.json, nor a config.json file. The estimate "
            "downloads nothing: pass a local model directory or its config.json (for a Hub model, fetch only its "
            "config first, e.g. `hf download <model id> config.json --local-dir <dir>`)."
        )
    try:
        values = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidInputError(f"{file}: not a readable JSON config ({err}).") from None
    if not isinstance(values, dict):
        raise InvalidInputError(f"{file}: not a transformers model config (a JSON object).")
    model_type = values.pop("model_type", None)
    try:
        return AutoConfig.for_model(model_type, **values)
    except ValueError:  # a model_type transformers does not know
        return PretrainedConfig(**values)
