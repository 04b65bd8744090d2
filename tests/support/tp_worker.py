"""One rank of the tensor-parallel tests: run under ``torchrun --nproc-per-node N tp_worker.py SPEC OUT_DIR``.

``SPEC`` is a JSON file ``{"cases": [...]}`` written by ``tests/integration/test_tensor_parallel.py``; each case
names a saved checkpoint (loaded sharded with ``tp_plan="auto"``), an optional draft checkpoint (loaded whole on
every rank), the prompt ids and the generate arguments. For each case the rank runs plain ``generate()`` and
TriForce under the same sharding and records the tokens, ``last_stats`` and the KV heads its caches held.
Case options: ``reuse`` continues with a second call from the cache the first returned; ``seed_per_rank`` seeds
rank ``r`` with ``seed + r`` (the call must be refused on every rank); ``skew_level0_clock`` makes level-0
timings look slow on odd ranks only, so that an adaptive planner deciding from its own clock would choose a
different schedule than rank 0. A case with ``samples: N`` runs no plain ``generate()``: it makes ``N`` TriForce
calls with the generate arguments ``sampling`` (call ``i`` seeded with ``seed + i``, alike on every rank) and
records each call's new tokens and the level statistics summed over the calls, for a distribution test against
plain sampling in the test process. Rank ``r`` writes ``OUT_DIR/rank{r}.json``.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.hf.versions import cache_kwargs, output_cache
from hf_triforce.hierarchy.planner import Planner

log = logging.getLogger("tp_worker")


def load(checkpoint: str, sharded: bool):
    """The model at ``checkpoint``, sharded over the ranks with the model's own TP plan or whole."""
    kwargs = {"tp_plan": "auto"} if sharded else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # tp_plan= is deprecated for distributed_config=
        model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="sdpa", **kwargs)
    return model.to(torch.float32).eval()


def skew_level0_clock(skew: bool):
    """On odd ranks with ``skew``, level-0 proposals seem 1000x slower to the planner, so its own schedule would
    differ from rank 0's. Returns the function that undoes it."""
    observe = Planner.observe_level0

    def slow(self, requested: int, seconds: float) -> None:
        observe(self, requested, seconds * 1000.0 + 1.0)

    if skew and dist.get_rank() % 2:
        Planner.observe_level0 = slow

    def restore() -> None:
        Planner.observe_level0 = observe

    return restore


def models(case: dict, targets: dict, drafts: dict) -> tuple:
    """The case's sharded, TriForce-enabled target and its whole draft model (or ``None``), each loaded once."""
    if case["checkpoint"] not in targets:
        targets[case["checkpoint"]] = load(case["checkpoint"], sharded=True)
        hf_triforce.enable(targets[case["checkpoint"]])
    draft = case.get("draft")
    if draft and draft not in drafts:
        drafts[draft] = load(draft, sharded=False)
    return targets[case["checkpoint"]], drafts.get(draft)


def run_case(case: dict, targets: dict, drafts: dict) -> dict:
    """One case on this rank: plain and TriForce tokens, the stats and the cache's KV heads (or, for a
    ``samples`` case, :func:`run_samples`)."""
    model, draft = models(case, targets, drafts)
    if case.get("samples"):
        return run_samples(case, model, draft)
    prompt = torch.tensor([case["prompt"]])
    common = dict(max_new_tokens=case["max_new_tokens"], do_sample=case["do_sample"])
    if case["do_sample"]:
        common.update(temperature=1.0, top_k=0, top_p=1.0)
    if case.get("batch"):  # a second row: the prompt without its first 20 tokens, left-padded
        prompt = torch.cat([prompt, torch.cat([prompt.new_zeros(1, 20), prompt[:, 20:]], dim=1)])
        mask = torch.ones_like(prompt)
        mask[1, :20] = 0
        common.update(attention_mask=mask, pad_token_id=0)
    torch.manual_seed(case["seed"])
    plain = model.generate(prompt, **common)
    config = TriForceConfig(**case["triforce"])
    torch.manual_seed(case["seed"] + (dist.get_rank() if case.get("seed_per_rank") else 0))
    forwards = []  # the target's forwards during the TriForce call: none may run before a refusal
    hook = model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        out = model.generate(
            prompt, triforce_config=config, assistant_model=draft, return_dict_in_generate=True, **common
        )
    except hf_triforce.UnsupportedGenerationError as error:
        return {"name": case["name"], "error": str(error), "forwards": len(forwards)}
    finally:
        hook.remove()
    stats = hf_triforce.last_stats(model)
    if case.get("batch"):  # every row; the output of a batch carries no cache
        return {"name": case["name"], "plain": plain.tolist(), "triforce": out.sequences.tolist(),
                "level1_drafted": stats.level1.drafted, "rounds": dict(stats.rounds)}  # fmt: skip
    layer = output_cache(out).layers[0]
    reuse = reuse_cache(model, out, config, common) if case.get("reuse") else {}
    return {
        **reuse,
        "name": case["name"],
        "plain": plain[0].tolist(),
        "triforce": out.sequences[0].tolist(),
        "full_cache_bytes": stats.full_cache_bytes,
        "kv_heads": int(layer.keys.shape[1]),
        "rounds": dict(stats.rounds),
        "level0_drafted": stats.level0.drafted,
        "level1_drafted": stats.level1.drafted,
    }


SAMPLED_LEVELS = ("level0", "level1", "level0_to_level2")
"""The levels whose counts a ``samples`` case sums (see :mod:`hf_triforce.stats`)."""
COUNTS = ("drafted", "accepted", "rejections")


def run_samples(case: dict, model, draft) -> dict:
    """``case["samples"]`` sampled TriForce calls, call ``i`` seeded with ``case["seed"] + i`` (alike on every rank).

    Returns the new tokens of each call and, per level, the drafted / accepted / rejected counts summed over the
    calls: the test compares the tokens' distribution with plain sampling and checks from the counts that both
    levels speculated and rejected (a TriForce decoding plainly would pass the distribution test too).
    """
    prompt = torch.tensor([case["prompt"]])
    config = TriForceConfig(**case["triforce"])
    sampling = case["sampling"]  # generate()'s sampling arguments, do_sample=True included
    totals = {level: dict.fromkeys(COUNTS, 0) for level in SAMPLED_LEVELS}
    samples = []
    for seed in range(case["seed"], case["seed"] + case["samples"]):
        torch.manual_seed(seed)
        out = model.generate(
            prompt, triforce_config=config, assistant_model=draft, max_new_tokens=case["max_new_tokens"], **sampling
        )
        samples.append(out[0, prompt.shape[1] :].tolist())
        levels = hf_triforce.last_stats(model).to_dict()["levels"]
        for level in SAMPLED_LEVELS:
            for count in COUNTS:
                totals[level][count] += levels[level][count]
    return {"name": case["name"], "samples": samples, "levels": totals}


def reuse_cache(model, out, config: TriForceConfig, common: dict) -> dict:
    """A second call continuing ``out`` from the cache the first returned, and plain ``generate()`` of the same."""
    sequences = out.sequences
    more = {**common, "max_new_tokens": 8}
    plain = model.generate(sequences, **more)
    again = model.generate(sequences, triforce_config=config, **more, **cache_kwargs(output_cache(out)))
    return {"reuse_plain": plain[0].tolist(), "reuse_triforce": again[0].tolist()}


def main(spec_path: str, out_dir: str) -> None:
    """Run every case of ``spec_path`` on this rank and write ``out_dir/rank{rank}.json``."""
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    targets: dict = {}
    drafts: dict = {}
    results = []
    for case in spec["cases"]:
        restore = skew_level0_clock(case.get("skew_level0_clock", False))
        try:
            results.append(run_case(case, targets, drafts))
        finally:
            restore()
        log.info("rank %d: %s done", dist.get_rank(), case["name"])
    rank = dist.get_rank()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"world": dist.get_world_size(), "results": results}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main(*sys.argv[1:3])
