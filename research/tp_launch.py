"""Before a tensor-parallel benchmark (``python -m research.lab_bench --tp N``) loads anything: is it launched right?

``--tp N`` runs one process per rank, started by ``torchrun --nproc-per-node N``, which tells each process the
world it belongs to through ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``. :func:`check_tensor_parallel` refuses, with
the command to run instead, a process that ``torchrun`` did not start with ``N`` ranks, the options that only
mean something in one process, and a model whose KV heads ``N`` ranks cannot split. Then
:func:`quiet_other_ranks` leaves the talking to rank 0.

Example:
    >>> torchrun_command(2, "python -m research.lab_bench --tp 2 --new-tokens 8")
    'torchrun --nproc-per-node 2 -m research.lab_bench --tp 2 --new-tokens 8'
"""

from __future__ import annotations

import logging
import os
import shlex
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from transformers import AutoConfig

from hf_triforce.bench.bandwidth import kv_heads
from hf_triforce.bench.loading import ModelLoadError, check_model_path
from hf_triforce.bench.smollm2 import SMOLLM2_FACTS
from hf_triforce.errors import TriForceConfigError
from hf_triforce.hf.progress import quiet_transformers


class TensorParallelLaunchError(TriForceConfigError):
    """``--tp N`` cannot run as launched or configured; the message says what to run instead."""


def torchrun_command(tp: int, command: str = "") -> str:
    """The ``torchrun`` line that runs ``command`` (``"python -m research.lab_bench --tp N ..."``) on ``tp`` ranks.

    Example:
        >>> torchrun_command(3)
        'torchrun --nproc-per-node 3 -m research.lab_bench --tp 3 ...'
    """
    arguments = shlex.split(command)[3:] or ["--tp", str(tp), "..."]
    return " ".join(["torchrun", "--nproc-per-node", str(tp), "-m", "research.lab_bench", shlex.join(arguments)])


def check_launch(tp: int, command: str = "", env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`TensorParallelLaunchError` unless ``tp`` is 1 or ``torchrun`` started ``tp`` ranks.

    Example:
        >>> check_launch(1, env={})  # one process: nothing to check
        >>> check_launch(2, env={"WORLD_SIZE": "2"})
        >>> check_launch(2, "python -m research.lab_bench --tp 2", env={})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        research.tp_launch.TensorParallelLaunchError: --tp 2 runs one process per rank, ...
    """
    env = os.environ if env is None else env
    if tp < 1:
        raise TensorParallelLaunchError(f"--tp {tp}: the number of tensor-parallel ranks must be 1 or more.")
    world = env.get("WORLD_SIZE")
    if tp == 1 or world == str(tp):
        return
    started = "this process was not started by torchrun" if world is None else f"torchrun started {world} ranks"
    raise TensorParallelLaunchError(
        f"--tp {tp} runs one process per rank, started by torchrun with {tp} ranks, but {started}. "
        f"Run: {torchrun_command(tp, command)}"
    )


def check_options(tp: int, preset: str | None, device: str | None) -> None:
    """Raise :class:`TensorParallelLaunchError` for a benchmark option that means nothing sharded over ranks.

    Example:
        >>> check_options(2, preset=None, device=None)
        >>> check_options(2, preset="tiny", device=None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        research.tp_launch.TensorParallelLaunchError: --preset cannot be combined with --tp: ...
    """
    if tp > 1 and preset is not None:
        raise TensorParallelLaunchError(
            "--preset cannot be combined with --tp: a random-weights preset is built whole in one process, and "
            "--tp loads a saved model sharded with its tensor-parallel plan. Save the model with save_pretrained() "
            "and pass --model DIR."
        )
    if tp > 1 and device is not None:
        raise TensorParallelLaunchError(
            f"--device cannot be combined with --tp: transformers places each rank itself (on the GPU of its "
            f"LOCAL_RANK with NCCL, on the CPU with gloo). Drop --device {device}."
        )


def check_kv_heads(tp: int, kv_heads: int, model: str) -> None:
    """Raise :class:`TensorParallelLaunchError` unless ``tp`` ranks can split ``model``'s ``kv_heads`` KV heads.

    Example:
        >>> check_kv_heads(2, 8, "llama")
        >>> check_kv_heads(2, 3, "SmolLM2")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        research.tp_launch.TensorParallelLaunchError: --tp 2 splits the KV heads over 2 ...
    """
    if kv_heads % tp == 0:
        return
    divisors = [str(n) for n in range(2, kv_heads + 1) if kv_heads % n == 0]
    listed = " or ".join([", ".join(divisors[:-1]), divisors[-1]] if len(divisors) > 1 else divisors)
    instead = f"use --tp {listed}" if divisors else "no --tp above 1 can split them"
    raise TensorParallelLaunchError(
        f"--tp {tp} splits the KV heads over {tp} ranks, but {model} has {kv_heads} KV heads, which do not divide "
        f"by {tp}: {instead}."
    )


def check_tensor_parallel(options: Any, command: str = "", env: Mapping[str, str] | None = None) -> None:
    """Every check of ``--tp`` (``options.tp``) before anything is loaded: the launch, the options, the KV heads.

    Only the model's ``config.json`` is read (for its KV heads); nothing is checked when ``options.tp`` is 1.

    Example:
        >>> check_tensor_parallel(LabOptions(tp=3), env={"WORLD_SIZE": "3"})  # doctest: +SKIP
    """
    check_launch(options.tp, command, env)
    if options.tp == 1:
        return
    check_options(options.tp, options.preset, options.device)
    name = options.model or "the embedded SmolLM2-135M-Instruct"
    check_kv_heads(options.tp, model_kv_heads(options.model), name)


def launch_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank as ``torchrun`` set it (``RANK``), 0 when it did not.

    Example:
        >>> launch_rank({"RANK": "1"}), launch_rank({})
        (1, 0)
    """
    return int((os.environ if env is None else env).get("RANK", "0"))


def rank_device(env: Mapping[str, str] | None = None) -> str:
    """The device transformers places this rank's shard on: the GPU of ``LOCAL_RANK`` with CUDA, else the CPU.

    Example:
        >>> rank_device({"LOCAL_RANK": "1"}) in ("cuda:1", "cpu")
        True
    """
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{int((os.environ if env is None else env).get('LOCAL_RANK', '0'))}"


def quiet_other_ranks() -> None:
    """On every rank but 0: log errors only, no warnings, no progress bars (rank 0 reports for all).

    Logging left at debug (``--debug``) stays so on every rank.

    Example:
        >>> quiet_other_ranks()  # rank 0 (or no torchrun): nothing changes
    """
    root = logging.getLogger()
    if launch_rank() == 0 or root.getEffectiveLevel() <= logging.DEBUG:
        return
    root.setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    quiet_transformers()


def model_kv_heads(path: str | None) -> int:
    """Key/value heads of the model :func:`load_model` would load, read from its config alone (no weights).

    Raises:
        ModelLoadError: as :func:`load_model`, for a path holding no readable config.

    Example:
        >>> model_kv_heads(None)  # the embedded SmolLM2-135M-Instruct
        3
    """
    if path is None:
        return SMOLLM2_FACTS["num_key_value_heads"]
    check_model_path(path)
    try:
        config = AutoConfig.from_pretrained(path).get_text_config()
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not read the config of {path}: {err}") from None
    return kv_heads(config)
