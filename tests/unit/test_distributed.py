"""The rank consensus of tensor-parallel runs: a no-op on one process, and the planner takes the agreed values."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hf_triforce import TriForceConfig
from hf_triforce.hf.distributed import (
    RankConsensus,
    random_state_fingerprint,
    random_states_differ,
    tensor_parallel_group,
    tensor_parallel_size,
)
from hf_triforce.hierarchy.planner import Plan, Planner

pytestmark = pytest.mark.unit


class FixedConsensus(RankConsensus):
    """Stands for rank 0 of a group: every agreement returns ``answers`` in turn, and records what was asked."""

    def __init__(self, *answers: list[int]) -> None:
        super().__init__(None)
        self.active, self.answers, self.asked = True, list(answers), []

    def agree(self, values):
        self.asked.append(list(values))
        return self.answers.pop(0)


class ShardedStub(torch.nn.Linear):
    """A module that says it is sharded over ``tp_size`` ranks, as a ``tp_plan`` model does."""

    def __init__(self, tp_size: int) -> None:
        super().__init__(2, 2)
        self.tp_size = tp_size


@pytest.fixture
def world_of_one():
    """A gloo process group of one rank, destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_no_group_is_a_no_op():
    consensus = RankConsensus(None)
    assert not consensus.active
    assert consensus.agree([2, 6]) == [2, 6]
    assert not RankConsensus.for_model(torch.nn.Linear(2, 2)).active


def test_unsharded_model_has_no_group_even_inside_a_process_group(world_of_one):
    assert tensor_parallel_size(torch.nn.Linear(2, 2)) == 1
    assert tensor_parallel_group(torch.nn.Linear(2, 2)) is None
    assert tensor_parallel_group(ShardedStub(tp_size=1)) is None


def test_broadcast_in_a_world_of_one_returns_the_values(world_of_one):
    assert tensor_parallel_group(ShardedStub(tp_size=2)) is world_of_one  # no device mesh: the world group
    assert RankConsensus(world_of_one).agree([1, 5, 0]) == [1, 5, 0]


def test_sharded_model_without_a_process_group_is_refused_nothing():
    """A model claiming shards while torch.distributed is not initialized: nothing to agree with, a no-op."""
    assert tensor_parallel_group(ShardedStub(tp_size=2)) is None


def test_planner_takes_the_agreed_plan_and_gamma1():
    consensus = FixedConsensus([2, 9], [0])  # rank 0 says: "plain"... with gamma2 9; then gamma1 0
    planner = Planner(TriForceConfig(gamma1=2, gamma2=6), has_drafter=True, consensus=consensus)
    assert planner.plan_round() == Plan("plain", 9)
    assert consensus.asked == [[0, 6]]  # this rank's own choice: "levels" (kind 0), 6 drafts
    planner.observe_level1(drafted=2, accepted=1, seconds=0.01)
    assert planner.gamma1() == 0
    assert len(consensus.asked) == 2


def test_one_sequence_under_tensor_parallelism_keeps_planned_lengths():
    """Rounds that stop by confidence would need rank 0's decision at every level-1 step: under TP they are off."""
    planner = Planner(
        TriForceConfig(gamma1=2, gamma2=6), has_drafter=True, consensus=FixedConsensus(), one_sequence=True
    )
    assert not planner.confidence_stops and planner.keep_drafting(1, survival=0.0)
    assert Planner(TriForceConfig(), has_drafter=True, one_sequence=True).confidence_stops


def test_non_adaptive_planner_sends_nothing():
    consensus = FixedConsensus()
    planner = Planner(TriForceConfig(gamma1=2, gamma2=6, adaptive=False), has_drafter=True, consensus=consensus)
    assert planner.plan_round() == Plan("levels", 6)
    assert planner.gamma1() == 2
    assert consensus.asked == []


def test_random_state_fingerprint_follows_the_seed():
    torch.manual_seed(3)
    seeded = random_state_fingerprint()
    torch.rand(4)
    assert random_state_fingerprint() != seeded
    torch.manual_seed(3)
    assert random_state_fingerprint() == seeded


def test_same_random_state_check_passes_alone(world_of_one):
    assert not random_states_differ(RankConsensus(None))
    assert not random_states_differ(RankConsensus(world_of_one))  # one rank always agrees with itself
