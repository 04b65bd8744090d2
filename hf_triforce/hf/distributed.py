"""Tensor parallelism: a sharded model all-reduces inside every forward, so its ranks must run the same forwards: a
decision from a rank's own clock is rank 0's, broadcast (:class:`RankConsensus`), and ranks share a random state."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch
import torch.distributed as dist


def tensor_parallel_size(model: torch.nn.Module) -> int:
    """How many ranks ``model``'s weights are sharded over (1: not sharded)."""
    return int(getattr(model, "tp_size", None) or 1)


def tensor_parallel_group(model: torch.nn.Module) -> dist.ProcessGroup | None:
    """The process group of ``model``'s tensor-parallel ranks, or ``None`` when it is not sharded over several."""
    if tensor_parallel_size(model) <= 1 or not (dist.is_available() and dist.is_initialized()):
        return None
    mesh = getattr(model, "_device_mesh", None)
    if mesh is None:
        return dist.group.WORLD
    return mesh["tp"].get_group() if mesh.mesh_dim_names and "tp" in mesh.mesh_dim_names else mesh.get_group()


class RankConsensus:
    """Makes every rank of a tensor-parallel ``group`` (``None``: a no-op) take rank 0's value of a decision (ints)."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.active = group is not None
        self._device = None  # where a collective takes its tensors: the current GPU for NCCL, else the CPU
        if group is not None:  # the backend: "nccl", or "cpu:gloo,cuda:nccl" for a mixed group
            nccl = "nccl" in str(dist.get_backend(group))
            self._device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> RankConsensus:
        """The consensus over ``model``'s tensor-parallel ranks."""
        return cls(tensor_parallel_group(model))

    def agree(self, values: Sequence[int]) -> list[int]:
        """Rank 0's ``values`` (``len(values)`` ints), on every rank of the group."""
        if not self.active:
            return list(values)
        tensor = torch.tensor(list(values), dtype=torch.int64, device=self._device)
        dist.broadcast(tensor, group=self.group, group_src=0)
        return tensor.tolist()


def random_state_fingerprint() -> int:
    """A 32-bit checksum of the global random state sampling draws from (the CPU's, and the current GPU's)."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.append(torch.cuda.get_rng_state())
    return zlib.crc32(b"".join(state.numpy().tobytes() for state in states))


def random_states_differ(consensus: RankConsensus) -> bool:
    """Whether the ranks' random states differ (on every rank alike): their forwards would then differ in width
    inside the same all-reduce (a hang on NCCL)."""
    if not consensus.active:
        return False
    fingerprint = random_state_fingerprint()
    tensor = torch.tensor([fingerprint, -fingerprint], dtype=torch.int64, device=consensus._device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=consensus.group)
    return int(tensor[0]) != -int(tensor[1])
