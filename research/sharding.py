"""Asking transformers for a tensor-parallel model, and what one rank holds of its weights.

Every supported release (5.17 and later) shards a model over the ``torchrun`` ranks with
``from_pretrained(..., distributed_config=DistributedConfig(tp_plan="auto"))``, initializing the process group
itself (gloo on the CPU, NCCL on GPUs); the older ``tp_plan="auto"`` keyword still works with a ``FutureWarning``
and is announced for removal, so hf_triforce asks with :func:`sharded_loading_kwargs`. Sharded weights are
``DTensor`` s (the embedding too since 5.24, a plain tensor before): :func:`local_shard` is the part a rank keeps.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from torch.distributed.tensor import DTensor


def sharded_loading_kwargs() -> dict[str, Any]:
    """``from_pretrained`` arguments that shard a model over the ``torchrun`` ranks with the model's own TP plan.

    Run under ``torchrun`` (``WORLD_SIZE`` ranks); transformers initializes the process group.

    Example:
        >>> sorted(sharded_loading_kwargs())
        ['distributed_config']
        >>> model = AutoModelForCausalLM.from_pretrained(path, **sharded_loading_kwargs())  # doctest: +SKIP
    """
    return {"distributed_config": transformers.DistributedConfig(tp_plan="auto")}


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this rank holds: the local shard of a ``DTensor``, any other tensor itself.

    Example:
        >>> local_shard(torch.zeros(2, 3)).shape
        torch.Size([2, 3])
    """
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
