"""Where two greedy outputs first differ, and whether the logits noise explains it (the benchmark's "identical")."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hf_triforce import InvalidInputError
from hf_triforce.bench.comparison import Comparison
from hf_triforce.bench.divergence import NEAR_TIE_ULPS, first_divergence, identical_cell, logit_ulp
from hf_triforce.bench.timed_run import RunResult

pytestmark = pytest.mark.unit

PLAIN, FAST = torch.tensor([[7, 1, 2, 3]]), torch.tensor([[7, 1, 2, 0]])
BF16_STEP_AT_2 = 2**-6  # bfloat16's spacing in [2, 4): 0.015625, the "one bf16 step" of test_bfloat16_greedy.py


def _logits(*rows: list[float]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.tensor([row]) for row in rows)


def test_equal_outputs_have_no_divergence():
    rows = _logits([0, 5, 0, 0], [0, 0, 5, 0], [0, 0, 0, 5])
    assert first_divergence(1, PLAIN, PLAIN.clone(), rows, rows, dtype=torch.bfloat16) is None


def test_a_near_tie_is_within_the_noise_the_agreeing_rows_had():
    p = _logits([0, 5.00, 0, 0], [0, 0, 5.00, 0], [2.01, 0, 0, 2.03])
    q = _logits([0, 5.02, 0, 0], [0, 0, 4.99, 0], [2.03, 0, 0, 2.02])  # rows 0-1 agree, noise 0.02
    found = first_divergence(1, PLAIN, FAST, p, q, dtype=torch.bfloat16)
    assert (found.new_token, found.plain_token, found.triforce_token) == (2, 3, 0)
    assert found.gaps == pytest.approx((0.02, 0.01)) and found.logits_noise == pytest.approx(0.02)
    assert found.row_noise == pytest.approx(0.02)
    assert found.near_tie and found.to_dict()["near_tie"] is True


def test_a_gap_beyond_the_agreeing_rows_noise_is_a_divergence():
    # The differing row moved by 3 where the rows before it moved by 0.02: not rounding. Its own noise would
    # "explain" any greedy difference (the two gaps always sum to at most twice it), so it is not the yardstick.
    p = _logits([0, 5.00, 0, 0], [0, 0, 5.00, 0], [1, 0, 0, 4])
    q = _logits([0, 5.02, 0, 0], [0, 0, 4.99, 0], [4, 0, 0, 2])
    found = first_divergence(1, PLAIN, FAST, p, q, dtype=torch.bfloat16)
    assert found.gaps == pytest.approx((3.0, 2.0)) and found.row_noise == pytest.approx(3.0)
    assert max(found.gaps) <= 2 * found.row_noise and not found.near_tie


def test_a_difference_at_the_first_new_token_is_never_a_near_tie():
    first = torch.tensor([[7, 0, 2, 3]])
    p = _logits([0, 1.00, 0, 0], [0, 0, 5, 0], [0, 0, 0, 5])
    q = _logits([1.01, 1.00, 0, 0], [0, 0, 5, 0], [0, 0, 0, 5])
    found = first_divergence(1, PLAIN, first, p, q, dtype=torch.bfloat16)
    assert found.new_token == 0 and found.logits_noise == 0.0 and not found.near_tie


def test_a_one_ulp_gap_with_matching_noise_is_a_bf16_near_tie():
    """The bf16 near-ties of test_bfloat16_greedy.py: top two logits (~2.8) one bf16 step apart, in the other
    run the other way round, after the runs' logits had differed by two steps (0.03)."""
    s = BF16_STEP_AT_2
    p = _logits([0, 3.0, 0, 0], [0, 0, 3.0, 0], [2.78125, 0, 0, 2.78125 + s])
    q = _logits([0, 3.0 + 2 * s, 0, 0], [0, 0, 3.0 - s, 0], [2.78125 + s, 0, 0, 2.78125])
    found = first_divergence(1, PLAIN, FAST, p, q, dtype=torch.bfloat16)
    assert found.gaps == (s, s) and found.logits_noise == 2 * s
    assert found.dtype == "bfloat16" and found.gap_cap == NEAR_TIE_ULPS * s == 0.25
    assert found.near_tie
    record = found.to_dict()
    assert record["gap_cap"] == 0.25 and record["dtype"] == "bfloat16" and record["near_tie"] is True
    assert json.loads(json.dumps(record)) == record


def test_a_gap_beyond_the_dtype_cap_is_a_divergence_whatever_the_noise():
    """A fault that moves every row's logits by ~2 (huge noise) and flips a token whose gap is 1: the noise rule
    alone would call it a near-tie; 1.0 is 64 bf16 steps at 3, beyond the cap."""
    p = _logits([0, 5.0, 0, 0], [0, 0, 5.0, 0], [2.0, 0, 0, 3.0])
    q = _logits([0, 7.0, 0, 0], [0, 0, 3.5, 0], [3.0, 0, 0, 2.0])
    found = first_divergence(1, PLAIN, FAST, p, q, dtype=torch.bfloat16)
    assert found.gaps == (1.0, 1.0) and found.logits_noise == 2.0
    assert max(found.gaps) <= 2 * found.logits_noise  # the uncapped rule's near-tie
    assert found.gap_cap == NEAR_TIE_ULPS * BF16_STEP_AT_2 and not found.near_tie
    assert found.to_dict()["near_tie"] is False


def test_float32_cap_is_far_tighter_than_bfloat16s():
    p = _logits([0, 5.00, 0, 0], [0, 0, 5.00, 0], [2.01, 0, 0, 2.03])
    q = _logits([0, 5.02, 0, 0], [0, 0, 4.99, 0], [2.03, 0, 0, 2.02])  # gaps 0.02 and 0.01 within noise 0.02
    bf16 = first_divergence(1, PLAIN, FAST, p, q, dtype=torch.bfloat16)
    fp32 = first_divergence(1, PLAIN, FAST, p, q, dtype=torch.float32)
    assert (bf16.gaps, bf16.logits_noise) == (fp32.gaps, fp32.logits_noise)
    assert fp32.gap_cap * 2**16 == bf16.gap_cap  # eps 2**-23 against 2**-7
    assert fp32.gap_cap == NEAR_TIE_ULPS * 2 * torch.finfo(torch.float32).eps  # the tied logits are in [2, 4)
    assert bf16.near_tie and not fp32.near_tie  # 0.02 is 1.3 bf16 units there, 84,000 float32 ones
    fp16 = first_divergence(1, PLAIN, FAST, p, q, dtype=torch.float16)
    assert fp32.gap_cap < fp16.gap_cap < bf16.gap_cap


@pytest.mark.parametrize(
    ("value", "ulp"),
    [(2.78, 2**-6), (-2.78, 2**-6), (4.0, 2**-5), (3.999, 2**-6), (20.0, 2**-3), (1.0, 2**-7), (0.01, 2**-7)],
)
def test_logit_ulp_is_the_bfloat16_spacing_at_the_value(value, ulp):
    assert logit_ulp(value, torch.bfloat16) == ulp
    if abs(value) >= 1:  # the next bfloat16 number above |value|'s power of two is one unit further
        power = 2.0 ** math.floor(math.log2(abs(value)))
        step = torch.nextafter(torch.tensor(power, dtype=torch.bfloat16), torch.tensor(1e9, dtype=torch.bfloat16))
        assert float(step) - power == ulp


def test_the_dtype_must_be_a_floating_torch_dtype():
    with pytest.raises(InvalidInputError, match="floating-point torch.dtype"):
        first_divergence(1, PLAIN, FAST, _logits([0]), _logits([0]), dtype=torch.int64)
    with pytest.raises(InvalidInputError, match="floating-point torch.dtype"):
        first_divergence(1, PLAIN, FAST, _logits([0]), _logits([0]), dtype="bfloat16")
    with pytest.raises(TypeError):
        first_divergence(1, PLAIN, FAST, _logits([0]), _logits([0]))  # no default: generate()'s logits are float32


def _run(sequences: torch.Tensor, logits) -> RunResult:
    return RunResult(sequences, new_tokens=3, prefill_seconds=0.1, decode_seconds_per_token=0.01, logits=logits)


def test_comparison_classifies_in_the_model_dtype():
    s = BF16_STEP_AT_2
    p = _logits([0, 3.0, 0, 0], [0, 0, 3.0, 0], [2.78125, 0, 0, 2.78125 + s])
    q = _logits([0, 3.0 + 2 * s, 0, 0], [0, 0, 3.0 - s, 0], [2.78125 + s, 0, 0, 2.78125])
    plain, fast = _run(PLAIN, p), _run(FAST, q)
    row = Comparison(plain, fast, {"do_sample": False}, dtype=torch.bfloat16).to_dict()["divergence"]
    assert row["near_tie"] is True and row["gap_cap"] == 0.25 and row["dtype"] == "bfloat16"
    assert Comparison(plain, fast, {}, dtype=torch.float32).divergence.near_tie is False
    assert Comparison(plain, _run(PLAIN.clone(), p), {}).divergence is None  # equal: no dtype needed
    with pytest.raises(ValueError, match="model's dtype"):
        _ = Comparison(plain, fast, {}).divergence  # built without one (the demo's Comparison)


@pytest.mark.parametrize(
    ("row", "cell"),
    [
        ({"identical_output": True, "temperature": 0.0}, "yes"),
        ({"identical_output": False, "temperature": 0.7, "divergence": None}, "n/a (sampling)"),
        ({"identical_output": False, "temperature": 0.0}, "NO"),
        ({"identical_output": False, "temperature": 0.0, "divergence": {"near_tie": True, "new_token": 2}},
         "near-tie at 2"),
        ({"identical_output": False, "temperature": 0.0, "divergence": {"near_tie": False, "new_token": 9}}, "NO at 9"),
        ({"identical_output": False, "temperature": 0.0, "divergence": {"near_tie": None, "new_token": 6}},
         "differs at 6 (unclassified)"),
        ({"identical_output": False, "temperature": 0.0, "divergence": {"near_tie": True, "new_token": 3,
          "gaps": [0.0, 0.21875], "logits_noise": 0.25, "row_noise": 0.28, "dtype": "bfloat16", "gap_cap": 0.5}},
         "near-tie at 3"),
    ],
)  # fmt: skip
def test_identical_cell(row, cell):
    assert identical_cell(row) == cell
