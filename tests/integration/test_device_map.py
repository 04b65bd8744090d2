"""TriForce on a model placed by accelerate (``device_map`` with ``max_memory``): layers offloaded to disk.

On the CPU the offloaded layers' weights are read from disk at each forward (accelerate's hooks) and every
key/value stays on the CPU, so the retrieval cache is unchanged: greedy output must equal plain ``generate()``,
with part of the model offloaded and with all of it (``{"": "disk"}``, every parameter on ``meta``), and a cache
prefilled by the caller is reused. The static-shape steps (``cuda_graphs=True`` or ``"eager"``) keep their
buffers on one device and cannot follow a dispatched model: refused before any forward.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

import hf_triforce
from hf_triforce import TriForceConfig, UnsupportedDeviceError, UnsupportedModelError
from hf_triforce.hf.versions import cache_kwargs

pytest.importorskip("accelerate")
pytestmark = pytest.mark.integration

SMALL = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, adaptive=False)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, model_factory):
    """``(directory, the same model in memory, its weight bytes)``: a tiny 4-layer Llama GQA, saved."""
    directory = tmp_path_factory.mktemp("device_map")
    model = model_factory("llama_gqa", num_layers=4, seed=5, enable=False)
    model.save_pretrained(directory / "model")
    return directory, model, sum(p.numel() * p.element_size() for p in model.parameters())


def offloaded(saved, cpu_bytes: int):
    """The saved model loaded with ``device_map="auto"``, ``cpu_bytes`` of CPU memory, the rest on disk."""
    directory, _, _ = saved
    model = AutoModelForCausalLM.from_pretrained(
        directory / "model",
        device_map="auto",
        max_memory={"cpu": cpu_bytes},
        offload_folder=str(directory / f"offload{cpu_bytes}"),
        attn_implementation="sdpa",
    ).eval()
    hf_triforce.enable(model)
    return model


@pytest.fixture(scope="module")
def half_offloaded(saved):
    """Embeddings and the first layers on the CPU, the rest on disk."""
    model = offloaded(saved, saved[2] // 2)
    assert {"cpu", "disk"} <= set(model.hf_device_map.values())
    return model


@pytest.fixture(scope="module")
def all_offloaded(saved):
    """Every weight on disk: ``hf_device_map == {"": "disk"}``, every parameter on ``meta``."""
    model = offloaded(saved, 1000)
    assert set(model.hf_device_map.values()) == {"disk"}
    return model


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_half_offloaded_greedy_equals_plain(saved, half_offloaded, llama_draft, make_prompt, assert_ran, drafter):
    _, in_memory, _ = saved
    prompt = make_prompt(160, seed=3, repetitive=drafter == "ngram")
    expected = in_memory.generate(prompt, max_new_tokens=20, do_sample=False)
    assistant = llama_draft if drafter == "model" else None
    cfg = TriForceConfig(**SMALL, drafter=drafter)
    got = half_offloaded.generate(prompt, triforce_config=cfg, assistant_model=assistant, max_new_tokens=20)
    assert torch.equal(got, expected)
    assert_ran(half_offloaded, drafted=("level0", "level1"), rejected=("level1",))


def test_all_offloaded_greedy_equals_plain_and_reuses_a_cache(saved, all_offloaded, make_prompt, assert_ran):
    _, in_memory, _ = saved
    prompt = make_prompt(160, seed=3, repetitive=True)
    expected = in_memory.generate(prompt, max_new_tokens=20, do_sample=False)
    cfg = TriForceConfig(**SMALL, drafter="ngram")
    assert torch.equal(all_offloaded.generate(prompt, triforce_config=cfg, max_new_tokens=20), expected)
    assert_ran(all_offloaded, drafted=("level0", "level1"))
    cache = DynamicCache(config=all_offloaded.config)
    with torch.no_grad():
        all_offloaded(input_ids=prompt[:, :100], use_cache=True, **cache_kwargs(cache))
    got = all_offloaded.generate(prompt, triforce_config=cfg, max_new_tokens=20, **cache_kwargs(cache))
    assert torch.equal(got, expected)
    assert_ran(all_offloaded, drafted=("level0", "level1"))
    assert hf_triforce.last_stats(all_offloaded).reused_tokens == 100


@pytest.mark.parametrize(
    ("cuda_graphs", "error", "message"),
    [("eager", UnsupportedModelError, "dispatched by accelerate"), (True, UnsupportedDeviceError, "CUDA device")],
)
def test_static_steps_are_refused_before_any_forward(
    half_offloaded, make_prompt, forward_counter, cuda_graphs, error, message
):
    """``"eager"``: the dispatch is named; ``True`` on the CPU: the device is (on a GPU it would be the dispatch)."""
    counter = forward_counter(half_offloaded.model.layers[0])
    cfg = TriForceConfig(**SMALL, drafter="ngram", cuda_graphs=cuda_graphs)
    try:
        with pytest.raises(error, match=message):
            half_offloaded.generate(make_prompt(100), triforce_config=cfg, max_new_tokens=4)
    finally:
        counter.remove()
