"""The bandwidth and memory models of a batch: what the batch benchmark's modeled figures and refusals rest on."""

from __future__ import annotations

import pytest

from hf_triforce import TriForceConfig
from hf_triforce.bench.bandwidth import expected_tokens
from research.batch import modeled_batch_speedup
from research.memory_fit import (
    H100_BYTES,
    MemoryBudgetError,
    check_batch_fits,
    largest_batch,
    required_bytes,
)
from research.memory_peak import MemoryEstimate, batch_estimate
from research.shapes import preset_config

pytestmark = pytest.mark.unit

LLAMA3 = preset_config("llama3.1-8b", 131072)


def test_speedup_grows_with_batch_and_context():
    """The KV share of a step grows with the batch and the context, and with it the modeled speedup."""
    figures = {
        (b, c): modeled_batch_speedup(LLAMA3, 2, b, c, 4096, 0.9, 6)["speedup"]
        for b in (1, 8, 32)
        for c in (32768, 131072)
    }
    assert figures[1, 32768] < figures[8, 32768] < figures[32, 32768]
    assert figures[8, 32768] < figures[8, 131072]
    assert figures[32, 131072] < expected_tokens(0.9, 6)  # never above the tokens a round yields


def test_speedup_by_hand():
    figures = modeled_batch_speedup(LLAMA3, 2, 4, 65536, 4096, 0.8, 4)
    kv = 2 * 32 * 8 * 128 * 2
    assert figures["plain_bytes"] - figures["level1_bytes"] == 4 * (65536 - 4096) * kv
    round_bytes = 4 * figures["level1_bytes"] + figures["plain_bytes"]
    assert figures["speedup"] == pytest.approx(expected_tokens(0.8, 4) * figures["plain_bytes"] / round_bytes)


def test_batch_estimate_scales_all_but_the_weights():
    one = MemoryEstimate(weights=100, kv=10, prefill=7, decode=2, summaries=1, view=3, draft=50, kept_view=4)
    four = batch_estimate(one, 4)
    assert (four.weights, four.draft) == (100, 50)
    assert (four.kv, four.prefill, four.decode, four.summaries, four.view, four.kept_view) == (40, 28, 8, 4, 12, 16)


def test_largest_batch_is_the_edge_of_what_fits():
    config, tc = preset_config("llama3.1-8b", 65536), TriForceConfig(retrieval_budget=4096)
    fits = largest_batch(config, 65536, 2, tc, H100_BYTES)
    assert fits >= 1
    check_batch_fits(config, fits, 65536, 2, tc, H100_BYTES)
    with pytest.raises(MemoryBudgetError, match=f"the largest batch that fits is {fits} rows"):
        check_batch_fits(config, fits + 1, 65536, 2, tc, H100_BYTES)
    assert required_bytes(MemoryEstimate(weights=0, kv=0, prefill=0, decode=0)) < H100_BYTES
