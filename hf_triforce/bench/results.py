"""Result files: the benchmark and the demo write their JSON here.

Example:
    >>> path = write_json({"rows": []}, "/tmp/hf_triforce-doctest/results.json")
    >>> json.loads(path.read_text())
    {'rows': []}
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def write_json(results: Any, path: str | os.PathLike[str], indent: int = 2, strict: bool = False) -> Path:
    r"""Write ``results`` as JSON (and a final newline) at ``path``, creating its directory; returns the path.

    Args:
        results: JSON-ready data.
        path: the file to write.
        indent: JSON indentation.
        strict: standard JSON: NaN floats become ``null`` and tensors or arrays lists (``.tolist()``).

    Example:
        >>> write_json({"x": float("nan")}, "/tmp/hf_triforce-doctest/x.json", strict=True).read_text()
        '{\n  "x": null\n}\n'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if strict:
        text = json.dumps(_finite(results), indent=indent, default=_as_list, allow_nan=False)
    else:
        text = json.dumps(results, indent=indent)
    path.write_text(text + "\n")
    return path


def _finite(value: Any) -> Any:
    """``value`` with every NaN float replaced by None (strict JSON)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _as_list(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")
