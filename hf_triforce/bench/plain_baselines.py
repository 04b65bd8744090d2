"""Every plain decoding a user can choose, timed on one prompt: the "best plain" baseline of the bench.

A speedup counts against the fastest decoding the user could get without speculation, not against
``generate()``'s defaults. :func:`measure_plain_decodings` times each configuration of
:data:`~hf_triforce.bench.plain_decoding.PLAIN_DECODINGS` on the same prompt (from a copy of its prefilled cache,
:mod:`.prefix`), after an untimed warm-up of its own (a compiled one compiles there), and reports a configuration
that cannot run here (another device's, a package not installed, an error) as such rather than dropping it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InternalError
from .plain_decoding import PlainDecoding, PlainDecodingUnavailable, generate_batch_one, plain_decoding
from .prefix import Prefix
from .timed_run import WARM_UP_TOKENS, RunResult, measure

logger = logging.getLogger(__name__)


def measure_plain_decodings(
    model,
    input_ids: torch.LongTensor,
    names: Sequence[str],
    prefix: Prefix | None = None,
    seed: int = 0,
    warm_up: bool = True,
    **generate_kwargs,
) -> dict[str, RunResult | str]:
    """Time each plain decoding of ``names`` on ``input_ids``: name -> its run, or why it did not run.

    Args:
        model: the model (plain ``generate()``; TriForce is not involved).
        input_ids: ``[1, prompt]`` token ids.
        names: names from :data:`~hf_triforce.bench.plain_decoding.PLAIN_DECODINGS`.
        prefix: start each call from a copy of this prefilled prompt (the CPU bench: a 7K prefill costs ~45 s
            there); None: fresh calls, ``generate()`` building each cache (a GPU, where copies of a long prompt's
            cache would not fit beside the model).
        seed: ``torch.manual_seed`` before each call.
        warm_up: first run each configuration untimed: :data:`~.timed_run.WARM_UP_TOKENS` tokens from a prefix
            (a compiled one compiles there: the prefix's static cache has the timed call's shape), the whole call
            without one (``generate()`` sizes a static cache by the call's length).
        generate_kwargs: the ``generate()`` arguments of every call.

    Example:
        >>> runs = measure_plain_decodings(model, ids, ["dynamic", "static"], max_new_tokens=128)  # doctest: +SKIP
        >>> best_plain(runs)  # doctest: +SKIP
        'static'
    """
    out: dict[str, RunResult | str] = {}
    for name in names:
        decoding = plain_decoding(name)
        try:
            if warm_up:
                _run(model, input_ids, prefix, decoding, seed, _warm_up_kwargs(decoding, prefix, generate_kwargs))
            out[name] = _run(model, input_ids, prefix, decoding, seed, generate_kwargs)
        except PlainDecodingUnavailable as err:
            out[name] = f"not run: {err}"
        except Exception as err:  # noqa: BLE001 - a configuration that fails on this device is a result to report
            logger.warning("plain decoding %s failed: %s: %s", name, type(err).__name__, err)
            out[name] = f"failed: {type(err).__name__}: {err}"
    return out


def best_plain(runs: dict[str, RunResult | str]) -> str:
    """The name of the fastest configuration that ran (lowest decode seconds per token).

    Raises:
        ValueError: none ran.
    """
    ran = {name: run for name, run in runs.items() if isinstance(run, RunResult)}
    if not ran:
        raise InternalError(f"no plain decoding ran: {runs}")
    return min(ran, key=lambda name: ran[name].decode_seconds_per_token)


def _warm_up_kwargs(decoding: PlainDecoding, prefix: Prefix | None, generate_kwargs: dict[str, Any]) -> dict[str, Any]:
    """A short call, except a static cache that ``generate()`` sizes itself: then the timed call's length."""
    if prefix is None and decoding.cache == "static":
        return generate_kwargs
    return {**generate_kwargs, "max_new_tokens": WARM_UP_TOKENS, "min_new_tokens": WARM_UP_TOKENS}


def _run(
    model, input_ids, prefix: Prefix | None, decoding: PlainDecoding, seed: int, kwargs: dict[str, Any]
) -> RunResult:
    with decoding.active(model):
        if decoding.cache is None:
            kwargs = {k: v for k, v in kwargs.items() if k != "prefill_chunk_size"}
            return _generate_batch(model, input_ids, seed, kwargs)
        cache = None if prefix is None else prefix.copy(decoding.cache)
        return measure(model, input_ids, seed=seed, **decoding.generate_kwargs(model, cache), **kwargs)


def _generate_batch(model, input_ids: torch.LongTensor, seed: int, kwargs: dict[str, Any]) -> RunResult:
    """``generate_batch()`` with the one request, timed from its per-token timestamps (its own prefill included in
    the first token, as for the other configurations)."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    sequences, stamps = generate_batch_one(model, input_ids, **kwargs)
    total = time.perf_counter() - start
    new = sequences.shape[1] - input_ids.shape[1]
    if len(stamps) >= 2:
        decode = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        first = total - (stamps[-1] - stamps[0])
    else:
        decode, first = total / max(new, 1), 0.0
    return RunResult(sequences, new, first, decode)
