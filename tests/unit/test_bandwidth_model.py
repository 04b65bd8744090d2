"""The bandwidth model and the shape presets the GPU benchmark reports against (DESIGN.md section 5)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hf_triforce.bench.bandwidth import (
    PEAK_BANDWIDTH,
    expected_tokens,
    kv_bytes_per_token,
    modeled_speedup,
    weight_bytes,
)
from research.lab_report import device_bandwidth
from research.shapes import PRESETS, preset_config, random_model

pytestmark = pytest.mark.unit


def test_design_figures():
    """DESIGN.md: Llama-2-7B has 0.5 MiB of KV per token, Llama-3.1-8B 128 KiB; 7B at 128K >= 24.5 ms on an H100."""
    assert kv_bytes_per_token(preset_config("llama2-7b", 4096), 2) == 2**19
    assert kv_bytes_per_token(preset_config("llama3.1-8b", 4096), 2) == 2**17
    cfg = preset_config("llama2-7b", 131072)
    floor_ms = 1e3 * (weight_bytes(cfg, 2) + 131072 * kv_bytes_per_token(cfg, 2)) / PEAK_BANDWIDTH["H100"]
    assert floor_ms == pytest.approx(24.5, abs=0.05)


@pytest.mark.parametrize("name", ["tiny", "draft-68m", "smollm2"])
def test_weight_bytes_counts_every_parameter(name):
    model = random_model(name, context=256, dtype=torch.float32, device="cpu")
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    assert weight_bytes(model.config, 4) == 4 * sum(unique.values())


def test_presets_build_in_the_requested_dtype():
    model = random_model("tiny", context=128, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32
    assert set(PRESETS) >= {"llama2-7b", "llama3.1-8b", "draft-68m", "smollm2"}


def test_unknown_preset():
    with pytest.raises(ValueError, match="choose one of"):
        preset_config("gpt-5", 1024)


def test_device_bandwidth():
    assert device_bandwidth("NVIDIA H100 80GB HBM3") == PEAK_BANDWIDTH["H100"]
    assert device_bandwidth("NVIDIA H200") == PEAK_BANDWIDTH["H200"]
    assert device_bandwidth(None) is None and device_bandwidth("cpu") is None


@given(a=st.floats(0.0, 0.999), gamma=st.integers(1, 16))
def test_expected_tokens_is_the_mean_accepted_prefix_plus_one(a, gamma):
    direct = sum(a**i for i in range(gamma + 1))  # P(at least i accepted) summed, plus the bonus token
    assert expected_tokens(a, gamma) == pytest.approx(direct, rel=1e-9)
    assert 1.0 <= expected_tokens(a, gamma) <= gamma + 1


def test_modeled_speedup_limits():
    # Nothing accepted and free drafts: one token per verification, as costly as a plain step -> 1x.
    assert modeled_speedup(10.0, 0.0, 10.0, 0.0, gamma2=4) == pytest.approx(1.0)
    # Everything accepted, free drafts, verification as costly as a step: gamma2 + 1 tokens per step.
    assert modeled_speedup(10.0, 0.0, 10.0, 1.0, gamma2=4) == pytest.approx(5.0)
    # A perfect level 0 makes level-1 tokens cheaper by (gamma1 + 1).
    two = modeled_speedup(56.0, 14.0, 60.0, 0.9, gamma2=6)
    three = modeled_speedup(56.0, 14.0, 60.0, 0.9, gamma2=6, level0_step_ms=0.0, level0_acceptance=1.0, gamma1=2)
    assert three > two
