"""TriForce on a tensor-parallel model: ``torchrun`` on the CPU (gloo), weights sharded with ``tp_plan="auto"``.

Tiny random models are saved with ``save_pretrained`` and loaded sharded by ``tests/support/tp_worker.py`` in
every rank (one ``torchrun`` launch per world size runs all the cases). Under the same sharding, TriForce's greedy
output must equal plain ``generate()``'s on every rank, a seeded sampling run must give the same tokens on every
rank, and each rank's retrieval cache must hold only its own KV heads (``full_cache_bytes`` = the single-process
figure / ranks). The default ``adaptive=True`` planner runs in every case; one case makes odd ranks' level-0
timings look 1000x slower, so ranks deciding from their own clocks would pick different schedules (and the
all-reduces would hang or disagree): they must all follow rank 0.

Sampling is also checked for its distribution, not only for rank agreement: ``NUM_TP_SAMPLES`` seeded TriForce calls
on 2 ranks (the 8-token-vocabulary model, prompt and sparse config of ``test_sampling_distribution.py``, its draft
model at level 0, ``adaptive=False`` so that every round runs both levels' rejection rules) against one plain sampled
``generate()`` call of the same model, unsharded, in this process: that module's chi-square homogeneity test on the
joint of the first 3 new tokens, at its ``ALPHA``. A TriForce call takes about 0.1 s under ``torchrun`` on 2 cores
(its all-reduces: 5x a single-process call), so the TriForce sample is small (300, not 1000) and the plain one, cheap
in one batched call, larger. Temperature 0.7 with top-p 0.8 makes the distribution peaked enough for that size:
:func:`test_tp_sampling_test_has_power` rejects a temperature off by 0.25 (p about 2e-21), and a worker whose
verification skipped residual resampling (drawing from ``p`` on a rejection) was rejected with p about 6e-11 when
this test was written, while the correct sampler passed with p = 0.2. Without top-p, or at temperature 1.0, the
skipped residual went undetected at this size (p 0.06 and 0.02), and at temperature 1.0 without top-p so did a
temperature of 1.25 (p 0.06). The summed level statistics show that both levels drafted and rejected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_triforce
from hf_triforce import TriForceConfig
from tests.support.homogeneity import describe, homogeneity_test, window_codes
from tests.support.speculation import Ran, check_ran

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "tp_worker.py"
LAUNCH_TIMEOUT_S = 240  # a hang (ranks in different collectives) fails the test instead of blocking the run
SMALL = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4)  # adaptive=True: the default
NEW_TOKENS = 20
ALPHA = 1e-3
"""The significance level of the sampling test (``test_sampling_distribution.py``'s)."""
VOCAB = 8
"""The distribution case's vocabulary (``test_sampling_distribution.py``'s): it divides over 2 ranks."""
HISTOGRAM_TOKENS = 3
"""New tokens tested jointly: the continuation codes ``homogeneity_test`` reads by default (512 of them)."""
NUM_TP_SAMPLES = 300
"""Sampled TriForce calls of the distribution case: about 30 s of the 2-rank launch on 2 cores."""
NUM_PLAIN_SAMPLES = 2000
"""Rows of the one plain sampled ``generate()`` call it is compared with (in this process: a few seconds)."""
PLAIN_SEED = 1_000_003  # not a TriForce call's seed: the two samples are independent
SAMPLING = {"do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 0.8}
WRONG_SAMPLING = {**SAMPLING, "temperature": 0.95}
SAMPLED = "llama_gqa-vocab8-samples"
SPARSE = dict(retrieval_budget=32, chunk_size=4, recent_window=8, refresh_every=2, gamma1=2, gamma2=4)
"""The sparse view of ``test_sampling_distribution.py``: the 100-token prompt is 4x the budget, so level 1's
distribution differs from level 2's and level 2 rejects some of its drafts."""


def three_kv_heads_llama() -> LlamaForCausalLM:
    """A tiny random Llama with 6 query / 3 KV heads (GQA), the head layout of SmolLM2 that 3 ranks split."""
    config = LlamaConfig(
        vocab_size=384,  # divisible by 3: transformers 5.17 gathers the lm_head output only in equal shards
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=3,
        head_dim=16,
        max_position_embeddings=4096,
        initializer_range=0.15,
        tie_word_embeddings=False,
    )
    torch.manual_seed(7)
    return LlamaForCausalLM(config).eval()


def prompt_ids(length: int, repetitive: bool, seed: int = 3) -> list[int]:
    """``length`` token ids: a repeated random 24-token pattern (n-gram lookup drafts) or uniform random."""
    gen = torch.Generator().manual_seed(seed)
    if repetitive:
        return torch.randint(0, 256, (24,), generator=gen).repeat(length // 24 + 1)[:length].tolist()
    return torch.randint(0, 256, (length,), generator=gen).tolist()


def case(name: str, checkpoint: Path, drafter: str, draft: Path | None = None, **options) -> dict:
    """One worker case: greedy unless ``do_sample=True``; ``skew_level0_clock=True`` skews odd ranks' timings;
    ``seed_per_rank=True`` seeds each rank differently; ``reuse=True`` continues from the returned cache."""
    triforce = {**SMALL, "drafter": drafter, **options.pop("triforce", {})}
    return {
        "name": name,
        "checkpoint": str(checkpoint),
        "draft": None if draft is None else str(draft),
        "prompt": prompt_ids(160, repetitive=drafter == "ngram"),
        "max_new_tokens": NEW_TOKENS,
        "do_sample": options.pop("do_sample", False),
        "seed": 1234,
        "triforce": triforce,
        "skew_level0_clock": options.pop("skew_level0_clock", False),
        "seed_per_rank": options.pop("seed_per_rank", False),
        "reuse": options.pop("reuse", False),
        "batch": options.pop("batch", False),
    }


def single_process_cache_bytes(model, spec_case: dict) -> int:
    """``full_cache_bytes`` of the same TriForce call in this (one) process."""
    hf_triforce.enable(model)
    model.generate(
        torch.tensor([spec_case["prompt"]]),
        triforce_config=TriForceConfig(**{**spec_case["triforce"], "drafter": "ngram"}),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
    )
    return hf_triforce.last_stats(model).full_cache_bytes


def launch(world: int, cases: list[dict], workdir: Path) -> list[dict]:
    """Run the worker on ``world`` ranks; ``[rank] -> {name: result}``."""
    spec, out = workdir / f"spec{world}.json", workdir / f"out{world}"
    out.mkdir()
    spec.write_text(json.dumps({"cases": cases}))
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    done = subprocess.run(
        [*command, str(WORKER), str(spec), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )
    errors = [line for line in done.stderr.splitlines() if "Error" in line and "]:" in line]
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n" + "\n".join(errors or [done.stderr[-6000:]])
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(rank["world"] == world for rank in ranks)
    return [{result["name"]: result for result in rank["results"]} for rank in ranks]


class Vocab8:
    """The distribution case's models, saved under ``workdir``: the 2-layer GQA target with a ``VOCAB``-token
    vocabulary (it divides over 2 ranks) kept unsharded here for plain sampling, its 1-layer draft model, and the
    100-token random prompt; the same models and prompt as ``test_sampling_distribution.py``'s."""

    def __init__(self, workdir: Path, model_factory) -> None:
        self.target = model_factory("llama_gqa", num_layers=2, seed=0, vocab_size=VOCAB, enable=False)
        self.target_dir, self.draft_dir = workdir / "vocab8", workdir / "vocab8-draft"
        self.target.save_pretrained(self.target_dir)
        model_factory("llama_gqa", num_layers=1, seed=100, vocab_size=VOCAB, enable=False).save_pretrained(
            self.draft_dir
        )
        self.prompt = torch.randint(0, VOCAB, (1, 100), generator=torch.Generator().manual_seed(1))

    def case(self) -> dict:
        """The worker case: ``NUM_TP_SAMPLES`` sampled TriForce calls, ``adaptive=False`` so that every round runs
        level 0 -> 1 -> 2 (both levels' rejection rules), 5 new tokens so that level 0 drafts inside the histogram."""
        return {
            "name": SAMPLED,
            "checkpoint": str(self.target_dir),
            "draft": str(self.draft_dir),
            "prompt": self.prompt[0].tolist(),
            "max_new_tokens": 5,
            "samples": NUM_TP_SAMPLES,
            "seed": 0,
            "sampling": SAMPLING,
            "triforce": {**SPARSE, "drafter": "model", "draft_cache_budget": 40, "adaptive": False},
        }

    def plain_codes(self, sampling: dict) -> np.ndarray:
        """Continuation codes of ``NUM_PLAIN_SAMPLES`` rows of one plain sampled ``generate()`` call."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(PLAIN_SEED)
            sequences = self.target.generate(
                self.prompt, max_new_tokens=HISTOGRAM_TOKENS, num_return_sequences=NUM_PLAIN_SAMPLES, **sampling
            )
        return codes(sequences[:, self.prompt.shape[1] :])


def codes(new_tokens) -> np.ndarray:
    """The first ``HISTOGRAM_TOKENS`` new tokens of each row read as a base-``VOCAB`` number (the continuation codes
    of ``test_sampling_distribution.homogeneity_test``)."""
    return window_codes(new_tokens, tuple(range(HISTOGRAM_TOKENS)), VOCAB)


@pytest.fixture(scope="module")
def vocab8(tmp_path_factory, model_factory) -> Vocab8:
    """The distribution case's models and prompt (see :class:`Vocab8`)."""
    return Vocab8(tmp_path_factory.mktemp("vocab8"), model_factory)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, model_factory, vocab8):
    """Results of the 2-rank launch and the single-process cache sizes: ``(ranks, single_bytes, cases)``."""
    workdir = tmp_path_factory.mktemp("tp2")
    models, cases = {}, []
    for family in ("llama_mha", "llama_gqa", "qwen3"):
        models[family] = model_factory(family, seed=1, enable=False)
        models[family].save_pretrained(workdir / family)
    draft_dir = workdir / "draft"
    model_factory("llama_gqa", num_layers=1, seed=101, enable=False).save_pretrained(draft_dir)
    gqa = workdir / "llama_gqa"
    for family in models:
        cases.append(case(f"{family}-ngram", workdir / family, "ngram", reuse=family == "llama_gqa"))
    cases += [
        case("llama_gqa-model", gqa, "model", draft_dir),
        case("llama_gqa-model-sample", gqa, "model", draft_dir, do_sample=True),
        case("llama_gqa-ngram-sample", gqa, "ngram", do_sample=True),
        case("llama_gqa-model-skewed", gqa, "model", draft_dir, skew_level0_clock=True),
    ]
    single = {c["name"]: single_process_cache_bytes(models[c["name"].split("-")[0]], c) for c in cases}
    cases.append(case("llama_gqa-ngram-unseeded", gqa, "ngram", do_sample=True, seed_per_rank=True))
    cases.append(case("llama_gqa-ngram-batch", gqa, "ngram", batch=True))
    cases.append(case("llama_gqa-model-batch-sample", gqa, "model", draft_dir, do_sample=True, batch=True))
    cases.append(vocab8.case())
    return launch(2, cases, workdir), single, cases


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    """The 3-rank launch over a 3-KV-head Llama: ``(ranks, single_bytes)``."""
    workdir = tmp_path_factory.mktemp("tp3")
    model = three_kv_heads_llama()
    model.save_pretrained(workdir / "llama3kv")
    cases = [case("llama3kv-ngram", workdir / "llama3kv", "ngram")]
    single = single_process_cache_bytes(model, cases[0])
    return launch(3, cases, workdir), single


GREEDY = ["llama_mha-ngram", "llama_gqa-ngram", "qwen3-ngram", "llama_gqa-model", "llama_gqa-model-skewed"]


@pytest.mark.parametrize("name", GREEDY)
def test_greedy_equals_plain_generate_on_every_rank(two_ranks, name):
    ranks, _, _ = two_ranks
    for rank, results in enumerate(ranks):
        result = results[name]
        assert result["triforce"] == result["plain"], f"rank {rank}: TriForce differs from plain generate()"
        assert result["triforce"] == ranks[0][name]["triforce"]
        # it speculated: the adaptive planner's first round is always level 0 -> 1 -> 2, before it has timings
        assert result["level1_drafted"] > 0 and result["rounds"].get("levels", 0) > 0, result["rounds"]


def test_a_batch_equals_plain_generate_on_every_rank(two_ranks):
    """A left-padded batch of two rows under tensor parallelism: each row equals plain batched ``generate()`` of the
    same sharded model, on every rank (rank 0's adaptive decisions taken by all)."""
    ranks, _, _ = two_ranks
    for rank, results in enumerate(ranks):
        result = results["llama_gqa-ngram-batch"]
        assert result["triforce"] == result["plain"], f"rank {rank}: a row differs from plain batched generate()"
        assert result["triforce"] == ranks[0]["llama_gqa-ngram-batch"]["triforce"]
        assert result["level1_drafted"] > 0 and result["rounds"].get("levels", 0) > 0, result["rounds"]


def test_a_sampled_batch_gives_the_same_rows_on_every_rank(two_ranks):
    """Seeded sampling of a batch with a draft model: every rank draws the same rows (their distribution is the
    single-process batch's, tested in ``test_sampling_distribution.py``)."""
    ranks, _, _ = two_ranks
    rows = [results["llama_gqa-model-batch-sample"]["triforce"] for results in ranks]
    assert all(r == rows[0] for r in rows) and len(rows[0]) == 2
    assert all(results["llama_gqa-model-batch-sample"]["level1_drafted"] > 0 for results in ranks)


def test_a_returned_cache_is_reused_on_every_rank(two_ranks):
    """The cache of each rank holds its own KV heads; a second call from it must accept it and stay lossless."""
    ranks, _, _ = two_ranks
    for results in ranks:
        result = results["llama_gqa-ngram"]
        assert result["reuse_triforce"] == result["reuse_plain"]
        assert len(result["reuse_plain"]) == len(result["triforce"]) + 8


@pytest.mark.parametrize("name", ["llama_gqa-model-sample", "llama_gqa-ngram-sample"])
def test_seeded_sampling_gives_the_same_tokens_on_every_rank(two_ranks, name):
    ranks, _, cases = two_ranks
    tokens = [results[name]["triforce"] for results in ranks]
    prompt = next(c["prompt"] for c in cases if c["name"] == name)
    assert len(tokens[0]) == len(prompt) + NEW_TOKENS
    assert all(t == tokens[0] for t in tokens)


def test_sampled_triforce_is_distributed_like_plain_generate(two_ranks, vocab8):
    """Rank 0's sampled TriForce continuations and plain unsharded ``generate()``'s pass the homogeneity test; every
    rank drew the same ones; and the calls speculated: both levels drafted and rejected, level 1 accepted some."""
    ranks, _, _ = two_ranks
    result = ranks[0][SAMPLED]
    for rank, results in enumerate(ranks):
        assert results[SAMPLED]["samples"] == result["samples"], f"rank {rank} drew other tokens than rank 0"
        assert results[SAMPLED]["levels"] == result["levels"], f"rank {rank} ran another schedule than rank 0"
    assert len(result["samples"]) == NUM_TP_SAMPLES
    p_value, table, labels = homogeneity_test(
        vocab8.plain_codes(SAMPLING), codes(result["samples"]), VOCAB, HISTOGRAM_TOKENS
    )
    levels = result["levels"]
    assert p_value > ALPHA, (
        f"TriForce sampling on 2 ranks is not distributed like plain generate(): chi-square p-value {p_value:.3g} <= "
        f"alpha {ALPHA} ({NUM_TP_SAMPLES} vs {NUM_PLAIN_SAMPLES} samples). Levels: {levels}.\n"
        + describe(table, labels, ("plain", "triforce"))
    )
    check_ran({"levels": levels}, Ran(drafted=("level0", "level1"), rejected=("level0", "level1")))
    assert 0 < levels["level1"]["accepted"] < levels["level1"]["drafted"], levels


def test_tp_sampling_test_has_power(two_ranks, vocab8):
    """The same test, at this sample size, tells the TriForce sample from plain sampling at temperature 0.95."""
    ranks, _, _ = two_ranks
    wrong = vocab8.plain_codes(WRONG_SAMPLING)
    p_value, table, labels = homogeneity_test(wrong, codes(ranks[0][SAMPLED]["samples"]), VOCAB, HISTOGRAM_TOKENS)
    assert p_value < ALPHA, (
        f"the homogeneity test did not detect a temperature off by 0.25 (p-value {p_value:.3g}, alpha {ALPHA}, "
        f"{NUM_TP_SAMPLES} TriForce samples): raise NUM_TP_SAMPLES.\n"
        + describe(table, labels, ("plain@T0.95", "triforce@T0.7"))
    )


def test_ranks_seeded_differently_are_refused_before_sampling(two_ranks):
    """Different random states would draw different tokens and then mismatch the all-reduces: refused on every rank."""
    ranks, _, _ = two_ranks
    for results in ranks:
        assert "Seed every rank alike" in results["llama_gqa-ngram-unseeded"]["error"]
        assert results["llama_gqa-ngram-unseeded"]["forwards"] == 0, "a forward ran before the refusal"


def test_each_rank_caches_only_its_kv_heads(two_ranks):
    ranks, single, _ = two_ranks
    for name in GREEDY:
        for results in ranks:
            assert results[name]["full_cache_bytes"] * 2 == single[name], name
    assert [ranks[0][f"{f}-ngram"]["kv_heads"] for f in ("llama_mha", "llama_gqa", "qwen3")] == [2, 1, 1]


def test_ranks_follow_rank_0s_adaptive_schedule(two_ranks):
    """Odd ranks' level-0 timings are skewed 1000x; the schedules (rounds by kind, level-0 drafts) still agree."""
    ranks, _, _ = two_ranks
    for name in ("llama_gqa-model-skewed", "llama_gqa-model", "llama_gqa-model-sample"):
        assert ranks[1][name]["rounds"] == ranks[0][name]["rounds"], name
        assert ranks[1][name]["level0_drafted"] == ranks[0][name]["level0_drafted"], name
    # the skewed case reuses the step costs the first draft-model case timed on this model (counts, not clocks): rank
    # 0's schedule is that case's, round for round, whatever rank 1's level-0 clock says (whether level 0 drafts at
    # all follows those costs: a probe round one token long leaves it no room)
    for key in ("rounds", "level0_drafted"):
        assert ranks[0]["llama_gqa-model-skewed"][key] == ranks[0]["llama_gqa-model"][key], key


def test_three_ranks_split_three_kv_heads(three_ranks):
    ranks, single = three_ranks
    for results in ranks:
        result = results["llama3kv-ngram"]
        assert result["triforce"] == result["plain"] == ranks[0]["llama3kv-ngram"]["triforce"]
        assert result["kv_heads"] == 1
        assert result["full_cache_bytes"] * 3 == single
