"""``bench --tp N``'s checks before loading, and the per-rank figures in one process (no torchrun needed)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from research.rank_figures import (
    attach_rank_figures,
    end_ranks,
    gather_rank_figures,
    same_text,
)
from research.rank_report import rank_section
from research.tp_launch import (
    TensorParallelLaunchError,
    check_kv_heads,
    check_launch,
    launch_rank,
    torchrun_command,
)

pytestmark = pytest.mark.unit


def test_torchrun_command_keeps_the_arguments():
    command = "python -m research.lab_bench --tp 4 --model 'my model' --new-tokens 8"
    assert torchrun_command(4, command) == (
        "torchrun --nproc-per-node 4 -m research.lab_bench --tp 4 --model 'my model' --new-tokens 8"
    )
    assert torchrun_command(2) == "torchrun --nproc-per-node 2 -m research.lab_bench --tp 2 ..."


def test_one_process_needs_no_torchrun():
    check_launch(1, env={})
    check_launch(1, env={"WORLD_SIZE": "4"})  # --tp 1 (the default) behaves as before, even under torchrun
    check_launch(4, env={"WORLD_SIZE": "4"})
    with pytest.raises(TensorParallelLaunchError, match="torchrun started 2 ranks"):
        check_launch(4, env={"WORLD_SIZE": "2"})
    with pytest.raises(TensorParallelLaunchError, match="1 or more"):
        check_launch(0, env={})


@pytest.mark.parametrize(
    ("kv_heads", "advice"),
    [(8, "use --tp 2, 4 or 8."), (3, "use --tp 3."), (6, "use --tp 2, 3 or 6."), (1, "no --tp above 1 can split")],
)
def test_kv_heads_that_do_not_divide_name_the_ranks_that_would(kv_heads, advice):
    with pytest.raises(TensorParallelLaunchError, match=f"has {kv_heads} KV heads") as error:
        check_kv_heads(5 if kv_heads > 1 else 2, kv_heads, "m")
    assert advice in str(error.value)
    check_kv_heads(kv_heads, kv_heads, "m")


def test_launch_rank_defaults_to_0():
    assert launch_rank({}) == 0 and launch_rank({"RANK": "3"}) == 3


def figures(rank: int, tokens: list[int]) -> dict:
    return {"rank": rank, "plain_ms_per_token": 2.0, "triforce_ms_per_token": 1.0, "speedup": 2.0,
            "level1_step_ms": 0.5, "verification_ms": 1.5, "full_cache_bytes": 100, "view_bytes": 40,
            "identical_output": True, "plain_new_tokens": tokens, "triforce_new_tokens": tokens}  # fmt: skip


def test_per_rank_figures_are_attached_and_tabled():
    results = {"rows": [{"prompt_tokens": 300, "temperature": 0.0}]}
    assert rank_section(results) == []
    assert gather_rank_figures([figures(0, [1])]) == [[figures(0, [1])]]  # one process: nothing to gather
    attach_rank_figures(results, [[figures(0, [1, 2]), figures(1, [1, 2])]], kv_heads=4)
    row = results["rows"][0]
    assert row["same_text_on_all_ranks"] is True and [r["rank"] for r in row["ranks"]] == [0, 1]
    assert "triforce_new_tokens" not in row["ranks"][0]
    assert results["tensor_parallel"]["kv_heads_per_rank"] == 2
    table = [line for line in rank_section(results) if line.startswith("| 300 |")]
    assert table == [f"| 300 | 0.0 | {r} | 2.0 | 1.0 | 2.00x | 0.5 | 1.5 | 100 | 40 | yes |" for r in (0, 1)]
    assert not same_text([figures(0, [1, 2]), figures(1, [1, 3])])


def test_the_benchmark_ends_its_process_group():
    """``bench --tp N`` ends with :func:`end_ranks`: the group is destroyed (no rank exits with it alive); without a
    group it does nothing."""
    end_ranks()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        end_ranks()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
