"""``preferred_attn_implementation``: flash attention when installed on a GPU, SDPA otherwise."""

from __future__ import annotations

import pytest

import hf_triforce.bench.backend as backend
from hf_triforce.bench.backend import preferred_attn_implementation

pytestmark = pytest.mark.unit


@pytest.fixture
def installed(monkeypatch):
    """``installed(fa2=..., fa3=..., capability=...)`` fakes which flash packages the machine has."""

    def set_(fa2: bool = False, fa3: bool = False, capability: tuple[int, int] = (9, 0)) -> None:
        monkeypatch.setattr(backend, "flash_attention_available", lambda generation: fa2 if generation == 2 else fa3)
        monkeypatch.setattr(backend.torch.cuda, "get_device_capability", lambda device=None: capability)

    return set_


@pytest.mark.parametrize(
    "device,fa2,fa3,capability,expected",
    [
        ("cpu", True, True, (9, 0), "sdpa"),  # flash kernels are CUDA-only
        ("cuda", False, False, (9, 0), "sdpa"),
        ("cuda", True, False, (9, 0), "flash_attention_2"),
        ("cuda:1", True, True, (9, 0), "flash_attention_3"),  # Hopper with FA3 installed
        ("cuda", True, True, (8, 0), "flash_attention_2"),  # FA3 needs Hopper
        ("cuda", False, True, (8, 0), "sdpa"),
    ],
)
def test_auto(installed, device, fa2, fa3, capability, expected):
    installed(fa2=fa2, fa3=fa3, capability=capability)
    assert preferred_attn_implementation(device) == expected


def test_explicit_choice_is_kept(installed):
    installed(fa2=True)
    assert preferred_attn_implementation("cuda", "eager") == "eager"
    assert preferred_attn_implementation("cpu", "sdpa") == "sdpa"


def test_unknown_choice_is_a_clear_error():
    with pytest.raises(ValueError, match="choose one of auto, sdpa"):
        preferred_attn_implementation("cpu", "flash")
