"""TriForce on a tensor-parallel model: ``torchrun`` on the CPU (gloo), weights sharded with ``tp_plan="auto"``.

Tiny random models are saved with ``save_pretrained`` and loaded sharded by ``tests/support/tp_worker.py`` in
every rank (one ``torchrun`` launch per world size runs all the cases). Under the same sharding, TriForce's greedy
output must equal plain ``generate()``'s on every rank, a seeded sampling run must give the same tokens on every
rank, and each rank's retrieval cache must hold only its own KV heads (``full_cache_bytes`` = the single-process
figure / ranks). The default ``adaptive=True`` planner runs in every case; one case makes odd ranks' level-0
timings look 1000x slower, so ranks deciding from their own clocks would pick different schedules (and the
all-reduces would hang or disagree): they must all follow rank 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_triforce
from hf_triforce import TriForceConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "tp_worker.py"
LAUNCH_TIMEOUT_S = 240  # a hang (ranks in different collectives) fails the test instead of blocking the run
SMALL = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4)  # adaptive=True: the default
NEW_TOKENS = 20


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


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, model_factory):
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


def test_ranks_seeded_differently_are_refused_before_sampling(two_ranks):
    """Different random states would draw different tokens and then mismatch the all-reduces: refused on every rank."""
    ranks, _, _ = two_ranks
    for results in ranks:
        assert "Seed every rank alike" in results["llama_gqa-ngram-unseeded"]["error"]


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
    assert ranks[0]["llama_gqa-model-skewed"]["level0_drafted"] > 0


def test_three_ranks_split_three_kv_heads(three_ranks):
    ranks, single = three_ranks
    for results in ranks:
        result = results["llama3kv-ngram"]
        assert result["triforce"] == result["plain"] == ranks[0]["llama3kv-ngram"]["triforce"]
        assert result["kv_heads"] == 1
        assert result["full_cache_bytes"] * 3 == single
