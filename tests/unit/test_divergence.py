"""Where two greedy outputs first differ, and whether the logits noise explains it (the benchmark's "identical")."""

from __future__ import annotations

import pytest
import torch

from hf_triforce.evaluation.common.divergence import first_divergence, identical_cell

pytestmark = pytest.mark.unit

PLAIN, FAST = torch.tensor([[7, 1, 2, 3]]), torch.tensor([[7, 1, 2, 0]])


def _logits(*rows: list[float]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.tensor([row]) for row in rows)


def test_equal_outputs_have_no_divergence():
    rows = _logits([0, 5, 0, 0], [0, 0, 5, 0], [0, 0, 0, 5])
    assert first_divergence(1, PLAIN, PLAIN.clone(), rows, rows) is None


def test_a_near_tie_is_within_the_noise_the_agreeing_rows_had():
    p = _logits([0, 5.00, 0, 0], [0, 0, 5.00, 0], [2.01, 0, 0, 2.03])
    q = _logits([0, 5.02, 0, 0], [0, 0, 4.99, 0], [2.03, 0, 0, 2.02])  # rows 0-1 agree, noise 0.02
    found = first_divergence(1, PLAIN, FAST, p, q)
    assert (found.new_token, found.plain_token, found.triforce_token) == (2, 3, 0)
    assert found.gaps == pytest.approx((0.02, 0.01)) and found.logits_noise == pytest.approx(0.02)
    assert found.row_noise == pytest.approx(0.02)
    assert found.near_tie and found.to_dict()["near_tie"] is True


def test_a_gap_beyond_the_agreeing_rows_noise_is_a_divergence():
    # The differing row moved by 3 where the rows before it moved by 0.02: not rounding. Its own noise would
    # "explain" any greedy difference (the two gaps always sum to at most twice it), so it is not the yardstick.
    p = _logits([0, 5.00, 0, 0], [0, 0, 5.00, 0], [1, 0, 0, 4])
    q = _logits([0, 5.02, 0, 0], [0, 0, 4.99, 0], [4, 0, 0, 2])
    found = first_divergence(1, PLAIN, FAST, p, q)
    assert found.gaps == pytest.approx((3.0, 2.0)) and found.row_noise == pytest.approx(3.0)
    assert max(found.gaps) <= 2 * found.row_noise and not found.near_tie


def test_a_difference_at_the_first_new_token_is_never_a_near_tie():
    first = torch.tensor([[7, 0, 2, 3]])
    p = _logits([0, 1.00, 0, 0], [0, 0, 5, 0], [0, 0, 0, 5])
    q = _logits([1.01, 1.00, 0, 0], [0, 0, 5, 0], [0, 0, 0, 5])
    found = first_divergence(1, PLAIN, first, p, q)
    assert found.new_token == 0 and found.logits_noise == 0.0 and not found.near_tie


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
    ],
)  # fmt: skip
def test_identical_cell(row, cell):
    assert identical_cell(row) == cell
