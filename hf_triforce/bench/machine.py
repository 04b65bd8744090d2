"""Where a result was measured: the machine record written beside every result, and how it is named in reports."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch
import transformers

from .. import __version__


def machine_info() -> dict[str, Any]:
    """Device, CPU, core count and library versions, recorded next to every result.

    Example:
        >>> sorted(machine_info())[:3]
        ['cpu', 'cpu_count', 'cuda_device']
    """
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cuda_driver": _cuda_driver(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_triforce": __version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def device_name(machine: dict[str, Any]) -> str:
    """The GPU's name, else the CPU's with torch's thread count.

    Example:
        >>> device_name({"cuda_device": None, "cpu": "AMD EPYC", "torch_threads": 2})
        'AMD EPYC (2 threads)'
    """
    return machine["cuda_device"] or f"{machine['cpu']} ({machine['torch_threads']} threads)"


def library_versions(machine: dict[str, Any]) -> str:
    """``"torch X, transformers Y, hf_triforce Z"`` of a :func:`machine_info` record.

    Example:
        >>> library_versions({"torch": "2.13.0", "transformers": "5.24.0", "hf_triforce": "0.2.0"})
        'torch 2.13.0, transformers 5.24.0, hf_triforce 0.2.0'
    """
    return f"torch {machine['torch']}, transformers {machine['transformers']}, hf_triforce {machine['hf_triforce']}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cuda_driver() -> str | None:
    if not torch.cuda.is_available():
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None
