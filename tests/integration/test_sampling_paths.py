"""The sampling test of ``test_sampling_distribution.py`` (its docstring has the method: the tiny 8-token model, the
sparse view, ``NUM_SAMPLES`` seeded TriForce runs against plain sampled ``generate()``, the chi-square homogeneity test
window by window at ``ALPHA``) on the other paths a sampled call can take: level 1's and level 0's fixed-shape steps,
token trees, level 0 -> 2 rounds and the adaptive planner's mix of schedules, and batches (left-padded rows, several
return sequences, cached prefixes). A separate module so that pytest-xdist's workers share the two halves.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import hf_triforce
import hf_triforce.sampling
from hf_triforce import TriForceConfig
from hf_triforce.hf.versions import CACHE_ARG, cache_kwargs
from tests.support.sampled_runs import (
    NEW_TOKENS,
    NUM_SAMPLES,
    SPARSE,
    VOCAB,
    WINDOW_ALPHA,
    Sampler,
    check_paths,
    detected,
    in_workers,
    same_distribution,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_intra_op_thread")]


def test_sampled_triforce_on_fixed_shapes(sampler):
    """``cuda_graphs="eager"``: level 1's and level 0's static steps (the forwards CUDA graphs replay;
    ``test_static_steps.py`` checks they run for this family): the same distribution, every level's rejection rule
    run."""
    processors = {"temperature": 0.8, "top_k": 6}
    got, totals = sampler.triforce(processors, "model", options={"cuda_graphs": "eager"})
    same_distribution(sampler.plain(processors), got, f"TriForce sampling on fixed shapes ({totals})")
    check_paths(totals, "model")


TREE_CASES = [
    pytest.param({"temperature": 0.9, "top_k": 5}, "none", id="temperature0.9-top_k5-none"),
    pytest.param({"repetition_penalty": 1.5}, "ngram", id="repetition_penalty1.5-ngram"),
]


@pytest.mark.parametrize("processors, drafter", TREE_CASES)
def test_sampled_token_trees_match_plain_generate(sampler, processors, drafter):
    """``tree_budget=8``: level 1 drafts a token tree (candidates drawn without replacement from its distribution at
    each node), level 2 verifies it with the multi-candidate rule: the same distribution; every run's first round a
    tree, level 1's candidates both accepted and rejected. With repetition penalty each node's scores read its own
    path."""
    plain = sampler.plain(processors)
    got, totals = sampler.triforce(processors, drafter, options={"tree_budget": 8})
    same_distribution(plain, got, f"TriForce token trees ({drafter=}, {processors}; totals {totals})")
    assert totals["tree_rounds"] >= NUM_SAMPLES, totals  # every run's first round (later ones may be plain steps)
    assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals
    assert totals["levels_rounds"] > totals["level1_rejections"], f"no tree accepted to a leaf: {totals}"


def test_power_against_a_tree_rule_without_the_residual(sampler, monkeypatch):
    """The same test rejects token trees whose later candidates are judged against ``p`` instead of the residual."""
    processors = {"temperature": 0.9, "top_k": 5}
    original = hf_triforce.sampling.after_rejection  # p stays p; q still loses the rejected candidate
    monkeypatch.setattr(hf_triforce.sampling, "after_rejection", lambda p, q, token: (p, original(p, q, token)[1]))
    got, totals = sampler.triforce(processors, "none", memoize=False, options={"tree_budget": 8})
    p_value, table = detected(sampler.plain(processors), got)
    assert p_value < WINDOW_ALPHA, (
        f"the homogeneity test did not detect token trees judged without the residual (smallest p-value "
        f"{p_value:.3g}; totals {totals}): raise NUM_SAMPLES.\n{table}"
    )


SCHEDULE_CASES = [
    pytest.param({"temperature": 0.8}, "model", "level0", id="level0-model"),
    pytest.param({"top_k": 4}, "ngram", "level0", id="level0-ngram"),
    pytest.param({"temperature": 1.1, "top_p": 0.9}, "model", "adaptive", id="adaptive-model"),
]


@pytest.mark.parametrize("processors, drafter, schedule", SCHEDULE_CASES)
def test_sampled_triforce_with_other_schedules_matches_plain_generate(sampler, processors, drafter, schedule):
    """The same test for level 0 -> 2 rounds (level 2 judges the drafter directly, with its probabilities or a
    one-hot ``q``) and for the adaptive planner's own mix of schedules."""
    plain = sampler.plain(processors)
    got, totals = sampler.triforce(processors, drafter, schedule=schedule)
    same_distribution(plain, got, f"TriForce sampling ({schedule=}, {drafter=}, {processors}; level totals {totals})")
    if schedule == "level0":
        assert totals["level1_drafted"] == 0, totals
        assert 0 < totals["level0_to_level2_accepted"] < totals["level0_to_level2_drafted"], totals
    else:  # the planner's own mix over many seeds: level 0 -> 1 -> 2 first, level 0 -> 2 only where the costs this
        # machine timed let it win (none, on a CPU where the draft model's steps cost too much; the level0 cases
        # judge those rounds)
        assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals


# ---------------------------------------------------------------------------------------------------
# Batches: every row of a batched call has its own prompt's distribution.

BATCH_COPIES = 50
"""``num_return_sequences`` of each batched call: 2 prompts x 50 copies = a batch of 100 rows."""


BATCH_SEEDS = range(NUM_SAMPLES // BATCH_COPIES)
"""Seeds of the batched calls, from 0: never chosen after a failure. (An earlier version moved them to 5000 after the
first case gave p = 0.00038 on these seeds; they are back at 0, and any failure is answered with more samples.)"""


BATCH_CASES = [
    ({"temperature": 0.9, "top_k": 5}, "ngram", {}),
    ({"top_p": 0.8}, "none", {}),
    ({"temperature": 1.2}, "model", {}),
    ({"temperature": 1.1}, "model", {"cuda_graphs": "eager"}),  # fixed-shape steps (what CUDA graphs replay)
]


def _batch_runs(target, batch, mask, config, kwargs: dict, seeds: range) -> tuple[torch.Tensor, dict[str, int]]:
    """Batched TriForce calls seeded with ``seeds``: their ``[len(seeds) * rows, T]`` sequences and summed
    statistics."""
    rows, totals = [], {"level1_drafted": 0, "level1_accepted": 0, "refreshes": 0}
    with torch.random.fork_rng(devices=[]):
        for seed in seeds:
            torch.manual_seed(seed)
            rows.append(
                target.generate(
                    batch,
                    attention_mask=mask,
                    max_new_tokens=NEW_TOKENS,
                    do_sample=True,
                    pad_token_id=0,
                    triforce_config=config,
                    **{"num_return_sequences": BATCH_COPIES, **kwargs},
                )
            )
            stats = hf_triforce.last_stats(target)
            totals["level1_drafted"] += stats.level1.drafted
            totals["level1_accepted"] += stats.level1.accepted
            totals["refreshes"] += stats.retrieval_refreshes
    return torch.cat(rows), totals


@pytest.mark.parametrize("processors, drafter, steps", BATCH_CASES)
def test_sampled_batch_rows_match_plain_generate(sampler, processors, drafter, steps):
    """A left-padded batch of two prompts (100 and 80 tokens), each repeated by ``num_return_sequences``: the rows
    of each prompt are distributed like plain sampling of that prompt alone, each prompt tested on its own."""
    short = torch.randint(0, VOCAB, (1, 80), generator=torch.Generator().manual_seed(2))
    batch = torch.cat([sampler.prompt, torch.cat([short.new_zeros(1, 20), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :20] = 0
    config = TriForceConfig(drafter=drafter, adaptive=False, **SPARSE, **steps)
    assistant = {"assistant_model": sampler.draft} if drafter == "model" else {}
    parts = in_workers(_batch_runs, (sampler.target, batch, mask, config, {**processors, **assistant}), BATCH_SEEDS)
    sequences = torch.cat([part[0] for part in parts])
    totals = {name: sum(part[1][name] for part in parts) for name in parts[0][1]}
    first = sequences.view(-1, 2, BATCH_COPIES, sequences.shape[-1])[:, 0].reshape(-1, sequences.shape[-1])
    second = sequences.view(-1, 2, BATCH_COPIES, sequences.shape[-1])[:, 1].reshape(-1, sequences.shape[-1])
    plain_second = Sampler(sampler.target, None, short).plain(processors)
    cases = (("100-token prompt", sampler.plain(processors), first), ("80-token prompt", plain_second, second))
    for name, plain, got in cases:
        same_distribution(
            plain, sampler.codes(got), f"batched TriForce rows ({name}, {drafter=}, {processors}; {totals})"
        )
    assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals
    assert totals["refreshes"] > 0, totals


def test_sampled_batch_from_cached_prefixes_matches_plain_generate(sampler):
    """The batch of :func:`test_sampled_batch_rows_match_plain_generate` (the 100-token prompt, and the 80-token one
    left-padded), its rows' first 60 tokens already in a per-row ``DynamicCache`` passed to each call: each prompt's
    rows are distributed like plain sampling of that prompt alone."""
    short = torch.randint(0, VOCAB, (1, 80), generator=torch.Generator().manual_seed(2))
    batch = torch.cat([sampler.prompt, torch.cat([short.new_zeros(1, 20), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :20] = 0
    rows, masks = batch.repeat_interleave(BATCH_COPIES, 0), mask.repeat_interleave(BATCH_COPIES, 0)
    prefix = DynamicCache()
    with torch.no_grad():
        positions = (masks[:, :60].cumsum(-1) - 1).clamp(min=0)
        sampler.target(input_ids=rows[:, :60], attention_mask=masks[:, :60], position_ids=positions, use_cache=True,
                       **cache_kwargs(prefix))  # fmt: skip
    config = TriForceConfig(drafter="ngram", adaptive=False, **SPARSE)
    reuse = {"num_return_sequences": 1, CACHE_ARG: prefix}  # a batched call copies the cache: every call starts alike
    parts = in_workers(_batch_runs, (sampler.target, rows, masks, config, reuse), BATCH_SEEDS)
    sequences = torch.cat([part[0] for part in parts]).view(-1, 2, BATCH_COPIES, batch.shape[1] + NEW_TOKENS)
    totals = {name: sum(part[1][name] for part in parts) for name in parts[0][1]}
    plain_short = Sampler(sampler.target, None, short).plain({})
    for name, plain, got in (("100-token prompt", sampler.plain({}), sequences[:, 0]), ("80-token", plain_short,
                                                                                        sequences[:, 1])):  # fmt: skip
        same_distribution(plain, sampler.codes(got.reshape(-1, got.shape[-1])), f"cached batch rows ({name}; {totals})")
    assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals
