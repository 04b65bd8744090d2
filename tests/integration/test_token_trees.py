"""Token trees (``TriForceConfig.tree_budget``): greedy output equals plain ``generate()`` in every family trees can
run, level 1 over a whole-sequence view accepts every first candidate (the tree mask and the positions by depth are
right at both levels), a round can end inside the tree (EOS, the length limit, a stop string) exactly where plain
decoding ends, and every call trees cannot serve is refused before any work. The sampled distribution is tested in
``test_sampling_paths.py`` (``test_sampled_token_trees_match_plain_generate``), the rule itself in
``tests/unit/test_tree_sampling.py``.
"""

from __future__ import annotations

import pytest
import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.errors import TriForceConfigError, UnsupportedGenerationError
from hf_triforce.hf.versions import output_cache
from tests.support.families import FAMILIES, build
from tests.support.speculation import Ran

pytestmark = pytest.mark.integration

TYPES = [family.model_type for family in FAMILIES]
SLIDING = [family.model_type for family in FAMILIES if family.sliding]
ALL_SLIDING = [family.model_type for family in FAMILIES if family.all_sliding]
SPARSE = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, adaptive=False, drafter="none")
NEW_TOKENS = 24


class TreeZoo:
    def __init__(self) -> None:
        self.models: dict[str, torch.nn.Module] = {}

    def __call__(self, model_type: str) -> torch.nn.Module:
        if model_type not in self.models:
            self.models[model_type] = hf_triforce.enable(build(model_type, seed=7))
        return self.models[model_type]


@pytest.fixture(scope="module")
def zoo() -> TreeZoo:
    return TreeZoo()


def prompt(seed: int = 0, length: int = 200) -> torch.LongTensor:
    return torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(seed))


def tree_rounds(model) -> int:
    return hf_triforce.last_stats(model).tree_rounds


@pytest.mark.parametrize("model_type", TYPES)
def test_greedy_trees_equal_plain_generate(zoo, assert_greedy_equal, model_type):
    """A sparse view (budget 64 of 224 tokens): level 1's candidates are often wrong, so paths end early and at
    every depth; the output is plain greedy decoding's, and every round drafted a tree. In a sliding layer (windows
    of 48 tokens, a quarter of the prompt) each node sees the window of its own position."""
    model = zoo(model_type)
    budget = 40 if model_type in ALL_SLIDING else 64  # at 64 a sliding layer's view is its whole window: no rejection
    cfg = TriForceConfig(**{**SPARSE, "retrieval_budget": budget}, tree_budget=12, gamma2=4)
    assert_greedy_equal(model, prompt(), cfg, NEW_TOKENS, ran=Ran(drafted=("level1",), rejected=("level1",)))
    stats = hf_triforce.last_stats(model)
    # every round drafted a tree but those of the last 4 tokens: the full cache (224 + gamma2 + 2 tokens in whole
    # chunks: 232 slots) has room for a 12-node tree up to 220 tokens; after, the rounds draft chains
    assert stats.tree_rounds >= stats.target_forwards - 5
    assert stats.tree_nodes > 2 * stats.tree_rounds


@pytest.mark.parametrize("model_type", TYPES)
def test_a_tree_over_a_whole_sequence_view_is_accepted(zoo, assert_greedy_equal, model_type):
    """Budget >= the sequence and the target's own weights: level 1 computes what level 2 computes, node by node, so
    every first candidate is accepted and each verification yields depth + 1 tokens. A tree mask that let a node see
    its cousins, or a node placed at the wrong position, would make level 1 differ from level 2 here."""
    model = zoo(model_type)
    cfg = TriForceConfig(**{**SPARSE, "retrieval_budget": 256}, tree_budget=10, gamma2=4, level1_weights="full")
    assert_greedy_equal(model, prompt(1), cfg, NEW_TOKENS, ran=Ran(accepted=("level1",), full_rounds=True))
    stats = hf_triforce.last_stats(model)
    assert stats.level1.per_token_acceptance == 1.0 and stats.tree_rounds > 0


@pytest.mark.parametrize("weights", ["full", "int8", "int4"])
def test_level1_weights_under_trees(zoo, assert_greedy_equal, weights):
    """Level 1's direct forward (Llama on the CPU) on each weight copy: the tree mask reaches its attention."""
    model = zoo("llama")
    cfg = TriForceConfig(**SPARSE, tree_budget=16, gamma2=5, level1_weights=weights)
    assert_greedy_equal(model, prompt(2), cfg, NEW_TOKENS)
    assert hf_triforce.last_stats(model).level1_forward == "direct" and tree_rounds(model) > 0


@pytest.mark.parametrize("new_tokens", [1, 2, 5, 9])
def test_the_length_limit_inside_a_tree(zoo, assert_greedy_equal, new_tokens):
    """``max_new_tokens`` landing at every depth of a tree (depth limited by what is left)."""
    model = zoo("llama")
    cfg = TriForceConfig(**{**SPARSE, "retrieval_budget": 256}, tree_budget=16, gamma2=6, level1_weights="full")
    ran = Ran(drafted=()) if new_tokens <= 2 else Ran()  # two new tokens: the round has no room for a draft
    assert_greedy_equal(model, prompt(3), cfg, new_tokens, ran=ran)


def test_the_full_cache_holds_max_length_and_a_chain_round_never_a_tree(zoo):
    """The full cache reserves ``max_length`` and one chain round (``full_cache_capacity``); a 16-node tree planned
    when fewer slots are left is drafted as a chain, so the storage never grows (it doubled, before)."""
    model = zoo("llama")
    cfg = TriForceConfig(**{**SPARSE, "retrieval_budget": 256}, tree_budget=16, gamma2=6, level1_weights="full")
    out = model.generate(prompt(3), max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                         triforce_config=cfg)  # fmt: skip
    assert torch.equal(out.sequences, model.generate(prompt(3), max_new_tokens=NEW_TOKENS, do_sample=False))
    stats = hf_triforce.last_stats(model)
    assert 0 < stats.tree_rounds < stats.target_forwards  # trees while they fit, then chains
    capacity = cfg.full_cache_capacity(200 + NEW_TOKENS)
    full = [layer for layer in output_cache(out).layers if not layer.is_sliding]
    assert full and all(layer.buffer.storage[0].shape[2] == capacity for layer in full)


def test_eos_and_stop_strings_inside_a_tree(zoo, assert_greedy_equal):
    """An end-of-sequence token chosen inside an accepted path ends the call there (level 1 gives it no children), as
    plain ``generate()`` ends it; scores returned per token are the verifier's at each path node."""
    model = zoo("llama")
    plain = model.generate(prompt(4), max_new_tokens=NEW_TOKENS, do_sample=False)
    eos = int(plain[0, 200 + 7])  # the 8th new token
    cfg = TriForceConfig(**{**SPARSE, "retrieval_budget": 256}, tree_budget=16, gamma2=6, level1_weights="full")
    assert_greedy_equal(model, prompt(4), cfg, NEW_TOKENS, eos_token_id=eos, pad_token_id=eos)
    common = dict(max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True, output_scores=True)
    expected = model.generate(prompt(4), **common)
    got = model.generate(prompt(4), triforce_config=cfg, **common)
    assert torch.equal(expected.sequences, got.sequences) and len(got.scores) == len(expected.scores)
    for a, b in zip(expected.scores, got.scores, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model_type", SLIDING[:3])
def test_a_sliding_layer_holds_its_window_and_a_tree(zoo, model_type):
    """A tree of 24 nodes (wider than a chain's round): a sliding layer's storage grows to its window and that
    tree, and holds its window once the accepted path is kept."""
    model = zoo(model_type)
    cfg = TriForceConfig(**SPARSE, tree_budget=24, gamma2=4)
    out = model.generate(prompt(), max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                         triforce_config=cfg)  # fmt: skip
    assert torch.equal(out.sequences, model.generate(prompt(), max_new_tokens=NEW_TOKENS, do_sample=False))
    assert tree_rounds(model) > 0
    sliding = [layer for layer in output_cache(out).layers if layer.is_sliding]
    window = sliding[0].window
    assert all(layer.buffer.length == window - 1 for layer in sliding)
    assert all(layer.buffer.storage[0].shape[2] <= window - 1 + 24 for layer in sliding)


def test_trees_are_refused_for_batches_and_fixed_shapes(zoo):
    model = zoo("llama")
    batch = torch.cat([prompt(5), prompt(6)])
    with pytest.raises(UnsupportedGenerationError, match="a batch verifies chains"):
        model.generate(batch, max_new_tokens=4, triforce_config=TriForceConfig(**SPARSE, tree_budget=8))
    with pytest.raises(TriForceConfigError, match="fixed shapes"):
        model.generate(
            prompt(), max_new_tokens=4, triforce_config=TriForceConfig(**SPARSE, tree_budget=8, cuda_graphs="eager")
        )
    out = model.generate(batch, max_new_tokens=6, do_sample=False, triforce_config=TriForceConfig(**SPARSE))
    assert torch.equal(out, model.generate(batch, max_new_tokens=6, do_sample=False))  # 'auto': chains, exact


@pytest.mark.parametrize("value", [1, -2, "wide", True, 2.5])
def test_bad_tree_budgets_are_refused(value):
    with pytest.raises(TriForceConfigError, match="tree_budget"):
        TriForceConfig(tree_budget=value)


def test_chains_stay_chains():
    """``tree_budget=0``: today's chains, whatever the measured costs."""
    from hf_triforce.hierarchy.planner import Plan, Planner

    planner = Planner(TriForceConfig(tree_budget=0), has_drafter=False, trees=True)
    for width in (1, 8, 64):
        planner.level2.observe(width, 0.01)
    planner.level1.observe(1, 0.001)
    assert planner.tree_for(Plan("levels", 6)) is None


def test_greedy_chains_measure_every_rank_at_every_node(zoo):
    """``stats.positional_acceptance`` of a greedy chain call (what 'auto' and the GPU model build trees from): each
    verified node is a trial for every rank, the rounds that accepted all their drafts included, so ``p_k`` is the
    unconditional rate Sequoia's program takes. A half-sparse view: some rounds accept everything, some miss."""
    model = zoo("llama")
    cfg = TriForceConfig(**{**SPARSE, "retrieval_budget": 128}, tree_budget=0, gamma2=4)
    model.generate(prompt(2), max_new_tokens=NEW_TOKENS, do_sample=False, triforce_config=cfg)
    stats = hf_triforce.last_stats(model)
    counts = stats.positional_acceptance
    assert counts["trials"][0] > 0 and len(set(counts["trials"])) == 1  # every rank tried at every node
    assert sum(counts["accepted"]) <= counts["trials"][0]
