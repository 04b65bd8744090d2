"""``TriForceConfig.recent_window``: level 1 selects with the window the config resolves (``'auto'``: a quarter of the
budget), on every path that re-selects (one sequence, a batch), and stays lossless.

The arithmetic of ``recent_tokens`` and the refusals of bad values: tests/integration/test_errors.py. What the window
buys (acceptance on natural text and copy tasks): benchmarks/results/recent-window-*.md.
"""

from __future__ import annotations

import pytest
import torch

from hf_triforce import TriForceConfig
from hf_triforce.caches.retrieval import RetrievalCache

pytestmark = pytest.mark.integration

BASE = dict(chunk_size=8, retrieval_budget=96, gamma1=2, gamma2=4, refresh_every=4, adaptive=False)


@pytest.fixture
def windows(monkeypatch) -> list[int]:
    """The ``recent_window`` of every selection level 1 makes during the test, recorded around the package's own
    ``RetrievalCache.select``."""
    seen: list[int] = []
    select = RetrievalCache.select

    def recording_select(self, queries, budget, recent_window, *args, **kwargs):
        seen.append(recent_window)
        return select(self, queries, budget, recent_window, *args, **kwargs)

    monkeypatch.setattr(RetrievalCache, "select", recording_select)
    return seen


@pytest.mark.parametrize("window,expected", [("auto", 24), (8, 8), (0, 0)])
@pytest.mark.parametrize("path", ["single", "batch"])
def test_level1_selects_with_the_resolved_window(llama, make_prompt, windows, assert_ran, window, expected, path):
    cfg = TriForceConfig(recent_window=window, **BASE)
    assert cfg.recent_tokens == expected
    prompt = make_prompt(200, seed=3)
    kwargs = dict(max_new_tokens=24, do_sample=False)
    if path == "batch":
        prompt = torch.cat([prompt, make_prompt(200, seed=5)])
        kwargs.update(attention_mask=torch.ones_like(prompt), pad_token_id=0)
    plain = llama.generate(prompt, **kwargs)
    out = llama.generate(prompt, triforce_config=cfg, **kwargs)
    assert torch.equal(out, plain)
    assert_ran(llama, rejected=("level1",))
    assert windows and set(windows) == {expected}
