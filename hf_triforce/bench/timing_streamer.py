"""A streamer that timestamps tokens, so decode speed can be measured with the prefill excluded."""

from __future__ import annotations

import time
from typing import Any

import torch


class TimingStreamer:
    """Records when each batch of tokens reaches the streamer; forwards them to ``inner`` if given.

    A streamer as ``generate(streamer=...)`` uses one: it calls :meth:`put` with token ids and :meth:`end`.

    ``generate()`` first puts the prompt, then the token produced by the prefill, then the decoded
    tokens (one at a time for plain decoding, a verified run at a time for TriForce). Decode latency
    is measured from the first generated token to the end of generation.

    Example:
        >>> timer = TimingStreamer()
        >>> out = model.generate(ids, max_new_tokens=32, streamer=timer)  # doctest: +SKIP
        >>> timer.decode_seconds_per_token  # doctest: +SKIP
    """

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.start = time.perf_counter()
        self.prompt_seen = False
        self.first_token_time: float | None = None
        self.end_time: float | None = None
        self.tokens = 0

    def put(self, value: torch.Tensor) -> None:
        if value.is_cuda:  # the token exists once the device is done, not when its kernels were launched
            torch.cuda.synchronize(value.device)
        now = time.perf_counter()
        if self.inner is not None:
            self.inner.put(value)
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        if self.first_token_time is None:
            self.first_token_time = now
        self.tokens += int(value.numel())

    def end(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.end_time = time.perf_counter()
        if self.inner is not None:
            self.inner.end()

    @property
    def prefill_seconds(self) -> float:
        """From the streamer's creation to the first generated token (prompt prefill and its step)."""
        return (self.first_token_time or self.start) - self.start

    @property
    def decode_seconds_per_token(self) -> float:
        """Mean seconds per generated token after the first one (prefill excluded)."""
        if self.first_token_time is None or self.end_time is None or self.tokens < 2:
            return float("nan")
        return (self.end_time - self.first_token_time) / (self.tokens - 1)
