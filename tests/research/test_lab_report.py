"""The research bench's report sections: each plain and TriForce ms/token beside the plain floor, a step's floors,
the ms/token a modeled speedup means."""

from __future__ import annotations

import pytest

from research.lab_report import _floors, _modeled_ms_per_token, attach_floors, floor_section
from tests.support.bench_rows import bench_row as row

pytestmark = pytest.mark.unit


def test_floors_on_a_gpu_of_known_bandwidth_only():
    rows = [row("a", 0.0, 1.0, 0.8, 0.5)]
    attach_floors(rows, None)
    assert "floor" not in rows[0]
    attach_floors(rows, 1e6)  # 1 MB/s: weights 1000 B + 7000 tokens x 10 B = 71 ms
    floor = rows[0]["floor"]
    assert floor["plain_floor_ms"] == pytest.approx(71.0) and floor["triforce_fraction"] == pytest.approx(500 / 71)
    assert set(floor["plain_ms"]) == {"dynamic", "static"}
    page = "\n".join(floor_section(rows, ["dynamic", "static", "flash_attention_2"]))
    assert (
        "## Against the plain decoding floor" in page
        and "| 7000 | 0 | 71.0 | 1000.0 | 800.0 | - | 500.0 | 7.04 |" in page
    )


def test_level1_floor_reads_the_copy_level1_drafts_with():
    """A row whose level 1 drafted on a low-bit copy (``level1_weight_bytes``) has a level-1 floor of the copy's
    bytes; the plain floor keeps the model's own weights (1 MB/s: (250 B + 512 x 10 B) and (1000 B + 7000 x 10 B))."""
    r = {**row("a", 0.0, 1.0, 0.8, 0.5), "config": {"retrieval_budget": 512}}
    assert _floors(r, 1e6) == ("71.0", "6.1")
    assert _floors({**r, "level1_weight_bytes": 250}, 1e6) == ("71.0", "5.4")


def test_modeled_ms_per_token_against_the_plain_floor():
    """A plain step of 60 ms and a modeled 3x: 20 ms a token, twice a 10 ms floor; no floor on a CPU."""
    assert _modeled_ms_per_token(60.0, 3.0, "10.0") == "20.0 (2.00x)"
    assert _modeled_ms_per_token(60.0, 3.0, "-") == "20.0"
    assert _modeled_ms_per_token(60.0, None, "10.0") == "-"
