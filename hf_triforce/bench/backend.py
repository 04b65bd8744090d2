"""Which attention implementation to load a model with: flash attention when installed, SDPA otherwise."""

from __future__ import annotations

import torch

from ..errors import TriForceConfigError
from ..hf.versions import flash_attention_available
from .options import ATTN_CHOICES


def preferred_attn_implementation(device: str | torch.device, requested: str = "auto") -> str:
    """The ``attn_implementation`` to pass to ``from_pretrained`` for a model that will run on ``device``.

    ``"auto"``: FlashAttention 3 on a Hopper GPU with ``flash_attn_interface``, else FlashAttention 2 on CUDA with
    ``flash_attn``, else ``"sdpa"``; any other choice is returned as given. TriForce's fixed-shape steps
    (``TriForceConfig.cuda_graphs``) need ``sdpa`` or ``eager``.

    Raises:
        ValueError: ``requested`` is not one of :data:`ATTN_CHOICES`.

    Example:
        >>> preferred_attn_implementation("cpu")
        'sdpa'
    """
    if requested not in ATTN_CHOICES:
        raise TriForceConfigError(f"attn_implementation={requested!r}: choose one of {', '.join(ATTN_CHOICES)}.")
    if requested != "auto":
        return requested
    if torch.device(device).type != "cuda":
        return "sdpa"
    if flash_attention_available(3) and torch.cuda.get_device_capability(device)[0] == 9:
        return "flash_attention_3"
    return "flash_attention_2" if flash_attention_available(2) else "sdpa"
