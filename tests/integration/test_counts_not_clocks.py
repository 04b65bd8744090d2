"""The planner decides from counts, not clocks: a call's step costs are timed once per model, device and kind of call
(forwards whose results are discarded, before the first round), then fixed; every round is priced from them and the
call's acceptance counts. So the same seed gives the same text, call after call, whatever else the machine does;
and no device synchronization happens in the rounds unless timing is asked for (``hf_triforce.phase_timing``).
"""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.generation.state import state_of

pytestmark = pytest.mark.integration

SMALL = dict(retrieval_budget=64, chunk_size=8, recent_window=16, refresh_every=4, gamma1=2, gamma2=6)


def _spin(seconds: float) -> None:
    """Keep one core busy."""
    end = os.times().elapsed + seconds
    while os.times().elapsed < end:
        pass


def _sampled(model, prompt: torch.LongTensor) -> torch.Tensor:
    torch.manual_seed(1234)
    cfg = TriForceConfig(drafter="ngram", **SMALL)
    return model.generate(prompt, max_new_tokens=48, do_sample=True, temperature=0.8, triforce_config=cfg)


def test_the_same_seed_gives_the_same_text_with_the_machine_loaded(model_factory, make_prompt):
    """Three sampled calls in a row with one seed, the other core busy during the second and third: identical text.
    The first call timed the costs (forwards whose tokens and random draws left no trace) and decided from them; the
    next two decided from the kept costs."""
    model = model_factory("llama_gqa")
    prompt = make_prompt(300, seed=5, repetitive=True)
    first = _sampled(model, prompt)
    stats = hf_triforce.last_stats(model)
    assert stats.phases.calls.get("calibration") == 1 and stats.planner["decisions"] > 0
    for _ in range(2):
        burner = multiprocessing.get_context("spawn").Process(target=_spin, args=(30.0,), daemon=True)
        burner.start()
        try:
            again = _sampled(model, prompt)
        finally:
            burner.terminate()
        assert torch.equal(again, first)
        assert "calibration" not in hf_triforce.last_stats(model).phases.calls  # the kept costs decided
    (costs,) = [c for kept in state_of(model).calibrations.values() for c in kept]
    assert not costs.measuring and costs.level2.known and costs.level1.known


def test_costs_are_timed_again_only_outside_their_context_band(model_factory, make_prompt):
    """A call at a context more than twice the one the costs were timed at times its own; one within reuses them."""
    model = model_factory("llama_gqa")
    cfg = TriForceConfig(drafter="ngram", **SMALL)
    for length, timed in ((200, True), (300, False), (900, True), (700, False)):
        model.generate(make_prompt(length, seed=1), max_new_tokens=12, do_sample=False, triforce_config=cfg)
        assert ("calibration" in hf_triforce.last_stats(model).phases.calls) == timed, length
    assert sorted(c.context for kept in state_of(model).calibrations.values() for c in kept) == [200, 900]


def test_rounds_do_not_synchronize_the_device_unless_asked(model_factory, make_prompt, monkeypatch):
    """With a CUDA device present, a call synchronizes after its prefill, while timing its costs and at its end, never
    in a round; inside ``phase_timing()`` it synchronizes after every phase."""
    model = model_factory("llama_gqa")
    prompt = make_prompt(300, seed=5, repetitive=True)
    syncs: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1))
    cfg = TriForceConfig(drafter="ngram", **SMALL)
    model.generate(prompt, max_new_tokens=32, do_sample=False, triforce_config=cfg)  # times the costs
    timed = len(syncs)
    syncs.clear()
    model.generate(prompt, max_new_tokens=32, do_sample=False, triforce_config=cfg)
    stats = hf_triforce.last_stats(model)
    assert sum(stats.rounds.values()) > 3 and len(syncs) == 2 < timed  # after the prefill, at the end
    syncs.clear()
    with hf_triforce.phase_timing():
        model.generate(prompt, max_new_tokens=32, do_sample=False, triforce_config=cfg)
    assert len(syncs) >= sum(hf_triforce.last_stats(model).phases.calls.values())
