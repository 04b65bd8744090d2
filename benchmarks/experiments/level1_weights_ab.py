"""Plain ``generate()`` against TriForce with level 1 on the model's own weights and on the int8 copy (issue 17).

One process, one 7K-token prompt (``hf-triforce bench``'s question about the Python reference), its prefix
prefilled once into a ``DynamicCache`` that every call starts from (a deep copy each time), 128 new tokens forced.
Each round runs every mode in turn, so all of them see the same drift of a shared machine; round 0 is a warm-up
and not recorded. Modes: ``plain``, or ``WEIGHTS[:key=value;...]`` (``TriForceConfig(retrieval_budget=512,
level1_weights=WEIGHTS, key=value ...)``), optionally suffixed ``fresh`` (no prefilled cache: the call prefills).

Run: ``.venv/bin/python benchmarks/experiments/level1_weights_ab.py --temperatures 0,0.6 --rounds 3
--output benchmarks/results/level1-weights-ab-7k.json`` (about 10 minutes on 2 CPU threads). Level 1's forward,
``int8:level1_forward=transformers`` against ``int8:level1_forward=direct``: ``--modes
plain,int8:level1_forward=transformers,int8:level1_forward=direct --output
benchmarks/results/level1-forward-ab-7k.json``. The int8 copy against the int4 one (both through the direct
forward): ``--modes plain,int8,int4``. Rounds that stop by confidence against planned lengths:
``--temperatures 0.6 --rounds 12 --modes plain,int8:confidence_stops=False,int8 --output
benchmarks/results/confidence-stops-ab-7k.json``.

Sampled rounds use seed ``round`` (each round its own text, the same for every mode of the round; a sampled
text's speed depends on the text, so the means are over several); greedy rounds are the same text each time.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics

import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.bench.questions import prefill
from hf_triforce.evaluation.bench.run import BenchOptions, bench_prompt, load_bench_models
from hf_triforce.evaluation.bench.timed_run import measure
from hf_triforce.evaluation.common.documents import read_document
from hf_triforce.evaluation.common.generate_kwargs import generate_kwargs
from hf_triforce.evaluation.common.machine import machine_info
from hf_triforce.hf.model import context_limit
from hf_triforce.hf.versions import cache_kwargs

logger = logging.getLogger("level1_weights_ab")


def mode_kwargs(mode: str) -> dict:
    """``generate()`` kwargs of a mode (see the module docstring)."""
    name = mode.replace("fresh", "")
    if name == "plain":
        return {}
    weights, _, rest = name.partition(":")
    pairs = (item.split("=") for item in rest.split(";") if item)
    over = {k: int(v) if v.isdigit() else {"True": True, "False": False}.get(v, v) for k, v in pairs}
    return {"triforce_config": TriForceConfig(**{"retrieval_budget": 512, "level1_weights": weights, **over})}


def run_round(model, ids, cache, modes, kw, seed: int = 0) -> dict[str, dict]:
    """Every mode once, each with ``seed``; ``{mode: {"tokens_per_second", "sequences", "stats"}}``."""
    out = {}
    for mode in modes:
        reuse = {} if "fresh" in mode else cache_kwargs(copy.deepcopy(cache))
        r = measure(model, ids, seed=seed, **reuse, **kw, **mode_kwargs(mode))
        out[mode] = {"tokens_per_second": r.tokens_per_second, "sequences": r.sequences, "stats": r.stats}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=7000)
    parser.add_argument("--temperatures", default="0,0.6")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="plain,full,int8")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(2)
    modes = args.modes.split(",")
    opts = BenchOptions(prompt_tokens=[args.prompt_tokens])
    model, tokenizer, _ = load_bench_models(opts, args.prompt_tokens)
    hf_triforce.enable(model)
    ids = bench_prompt(opts, tokenizer, read_document(None), args.prompt_tokens, context_limit(model), model)
    cache, _ = prefill(model, ids[:, :-1])
    records = []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        kw = generate_kwargs(128, temperature, 0.9, min_new_tokens=128)
        for index in range(args.rounds + 1):
            seed = index if temperature > 0 else 0
            runs = run_round(model, ids, cache, modes, kw, seed)
            if index == 0:
                continue
            same = all(torch.equal(r["sequences"], runs[modes[0]]["sequences"]) for r in runs.values())
            for mode, r in runs.items():
                stats = r["stats"] or {}
                records.append({"temperature": temperature, "round": index, "seed": seed, "mode": mode,
                                "tokens_per_second": r["tokens_per_second"], "rounds": stats.get("rounds"),
                                "phases": stats.get("phases"), "levels": stats.get("levels"),
                                "identical_to_first_mode": same if temperature == 0 else None})  # fmt: skip
                logger.info("T=%s round %d %s: %.2f tok/s", temperature, index, mode, r["tokens_per_second"])
    summary = {}
    for temperature in sorted({r["temperature"] for r in records}):
        means = {m: statistics.mean(r["tokens_per_second"] for r in records
                                    if r["temperature"] == temperature and r["mode"] == m) for m in modes}  # fmt: skip
        summary[str(temperature)] = {m: {"mean_tokens_per_second": v, "over_plain": v / means["plain"]}
                                     for m, v in means.items()} if "plain" in means else means  # fmt: skip
    result = {"title": "level-1 weights, interleaved", "machine": machine_info(), "modes": modes,
              "prompt_tokens": ids.shape[1], "summary": summary, "records": records}  # fmt: skip
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    logger.info("%s", json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
