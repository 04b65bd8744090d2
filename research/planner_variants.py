"""Variants of the adaptive planner at 7K: the default planner, each variant named by ``--variants`` (``Planner``
patched for that arm only), and fixed chains (``adaptive=False``), interleaved per prompt and temperature on the
bench's seven prompts (sampled pair ``i`` with seed ``i``), decode timed from the first streamed token to the last.

- ``full``: every level 0 -> 1 -> 2 round drafts ``gamma2`` tokens (no length chosen, no confidence stops).
- ``overall0``: level 0's drafts per level-1 step are priced at level 1's call-long acceptance of them, not the
  estimate after the last verdict.
- ``margin0``: a level-1 step drafts ``gamma1`` level-0 tokens unless fewer model ``SCHEDULE_MARGIN`` faster (the
  margin every other departure from level 0 -> 1 -> 2 needs), and level-1 steps level 0 sits out fade its
  acceptance estimate toward its call-long one (as rounds a level sits out do).
- ``margin0_nofade``: the margin of ``margin0`` only (level-1 steps without level-0 drafts leave its estimate).
- ``nostops``: sampled levels rounds run their planned length too (no stop by level 1's confidence).
- ``steady``: the schedules (levels, level 0 -> 2, plain) are compared at each level's call-long acceptance
  (``StreakAcceptance.overall``); the length of each is still chosen at the estimate after the last verdict.

Each call's counts go with it (``counts``: rounds by schedule, verifications, tokens, level 2's verdicts on level-0
drafts). Beside each call's wall-clock ms/token (``ms_per_token``) the record keeps its modeled ms/token
(``modeled_ms_per_token``): the seconds of every round's steps at the costs the process calibrated once (what the
planner prices rounds with), over the tokens. It counts what a call ran (verifications, level-1 steps and their
widths, level-0 proposals, re-selections), not how noisy the machine was while it ran; overheads outside the steps
are not in it.

    python -m research.planner_variants --variants full --pairs 2 \\
        --output benchmarks/results/counts-not-clocks/full-rounds-7k.json

Run it alone: on 2 cores anything else running moves the timings.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
from pathlib import Path

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.bench.documents import question_prompt
from hf_triforce.bench.generate_kwargs import generate_kwargs
from hf_triforce.bench.machine import machine_info
from hf_triforce.bench.prefix import Prefix
from hf_triforce.bench.prompt_set import BENCH_PROMPTS
from hf_triforce.bench.results import write_json
from hf_triforce.bench.smollm2 import load_smollm2
from hf_triforce.bench.timed_run import WARM_UP_TOKENS, measure
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.hierarchy.cost_model import expected_tokens
from hf_triforce.hierarchy.planner import SCHEDULE_MARGIN, Plan, Planner

logger = logging.getLogger("planner_variants")


@contextlib.contextmanager
def full(on: bool):
    """Within the block (``on``), levels rounds always draft ``gamma2`` tokens (``nostops`` and no length chosen)."""
    best_of = Planner._best_of
    if on:
        Planner._best_of = lambda self, kind: (
            Plan("levels", self.config.gamma2) if kind == "levels" else best_of(self, kind)
        )
    try:
        with nostops(on):
            yield
    finally:
        Planner._best_of = best_of


@contextlib.contextmanager
def overall0(on: bool):
    """Within the block (``on``), level 0's drafts per level-1 step are priced at ``a0``'s call-long rate."""
    level1_rate = Planner._level1_rate

    def priced(self, gamma1: int) -> float:
        step = self.level1(gamma1 + 1)
        draft = self.level0(gamma1) if gamma1 else 0.0
        if step is None or draft is None:
            return 0.0 if gamma1 else 1.0
        return expected_tokens(self.a0.overall.rate, gamma1) / (step + draft)

    if on:
        Planner._level1_rate = priced
    try:
        yield
    finally:
        Planner._level1_rate = level1_rate


@contextlib.contextmanager
def margin0(on: bool, fade: bool = True):
    """Within the block (``on``), level 0 drafts ``gamma1`` tokens a level-1 step unless fewer model
    ``SCHEDULE_MARGIN`` faster, and (``fade``) a level-1 step without level-0 drafts counts as a token level 0 sat
    out."""
    gamma1, observe_level1 = Planner._gamma1, Planner.observe_level1

    def margined(self) -> int:
        best = gamma1(self)  # the unmargined choice (probes, rank agreement and the re-measure counter included)
        full = self.config.gamma1
        if best != full and self._level1_rate(best) < SCHEDULE_MARGIN * self._level1_rate(full):
            (best,) = self.consensus.agree([full])
        return best

    def observed(self, drafted: int, accepted: int, seconds: float) -> None:
        observe_level1(self, drafted, accepted, seconds)
        if drafted == 0 and fade:
            self.a0.idle(1)

    if on:
        Planner._gamma1, Planner.observe_level1 = margined, observed
    try:
        yield
    finally:
        Planner._gamma1, Planner.observe_level1 = gamma1, observe_level1


def margin0_nofade(on: bool):
    """``margin0`` without the fade."""
    return margin0(on, fade=False)


@contextlib.contextmanager
def nostops(on: bool):
    """Within the block (``on``), levels rounds never stop by level 1's confidence."""
    keep = Planner.keep_drafting
    if on:
        Planner.keep_drafting = lambda self, drafted, survival: True
    try:
        yield
    finally:
        Planner.keep_drafting = keep


class _Overall:
    """A level's acceptance read at its call-long rate (what :func:`steady` compares schedules with)."""

    def __init__(self, acceptance) -> None:
        self.rate, self.verdicts, self.overall = acceptance.overall.rate, acceptance.verdicts, acceptance.overall


@contextlib.contextmanager
def steady(on: bool):
    """Within the block (``on``), ``Planner._best`` weighs its candidates (each at the length the latest-verdict
    estimates favour) at the levels' call-long acceptance."""
    margined = Planner._margined_rate

    def weighed(self, plan):
        kept = self.a1, self.a0, self.a02
        self.a1, self.a0, self.a02 = (_Overall(a) for a in kept)
        try:
            return margined(self, plan)
        finally:
            self.a1, self.a0, self.a02 = kept

    if on:
        Planner._margined_rate = weighed
    try:
        yield
    finally:
        Planner._margined_rate = margined


VARIANTS = {
    "full": full,
    "overall0": overall0,
    "margin0": margin0,
    "margin0_nofade": margin0_nofade,
    "nostops": nostops,
    "steady": steady,
}


@contextlib.contextmanager
def modeled_seconds():
    """Within the block, the planner's rounds add their modeled seconds and tokens to the yielded ``[seconds,
    tokens]`` (``Planner.observe_round`` sees both before it resets the round's)."""
    totals, observe_round = [0.0, 0], Planner.observe_round

    def counted(self, tokens: int, seconds: float) -> None:
        totals[0], totals[1] = totals[0] + self._modeled, totals[1] + tokens
        observe_round(self, tokens, seconds)

    Planner.observe_round = counted
    try:
        yield totals
    finally:
        Planner.observe_round = observe_round


def arms(variants: list[str]) -> dict:
    """name -> (config, context manager factory) for the planner, each variant and fixed chains."""
    out = {"planner": (TriForceConfig(), contextlib.nullcontext)}
    out.update({name: (TriForceConfig(), lambda v=VARIANTS[name]: v(True)) for name in variants})
    out["fixed"] = (TriForceConfig(adaptive=False), contextlib.nullcontext)
    return out


def call_counts(stats: dict) -> dict:
    """A call's rounds by schedule, verifications, and level 2's verdicts on level-0 drafts (rounds that drafted)."""
    skip = stats["levels"]["level0_to_level2"]
    return {
        "rounds": stats["rounds"],
        "target_forwards": stats["target_forwards"],
        "decoded_tokens": stats["decoded_tokens"],
        "level0_to_level2": {key: skip[key] for key in ("drafted", "accepted", "rejections")},
    }


def row(model, tokenizer, prompt, temperature: float, pairs: int, variants: list[str]) -> dict:
    """One prompt at one temperature: a warm-up call of each arm, then ``pairs`` interleaved calls of every arm."""
    ids = question_prompt(tokenizer, prompt.text(), prompt.question, 7000)
    kwargs = generate_kwargs(128, temperature, 0.9, min_new_tokens=128)
    prefix = Prefix(model, ids, 128)
    short = {**kwargs, "max_new_tokens": WARM_UP_TOKENS, "min_new_tokens": WARM_UP_TOKENS}
    every = arms(variants)
    for config, patched in every.values():  # warm-up; the first planner call times its costs
        with patched():
            measure(model, ids, triforce_config=config, **cache_kwargs(prefix.copy()), **short)
    runs: dict[str, list[float]] = {name: [] for name in every}
    modeled: dict[str, list[float]] = {name: [] for name in every}
    counts: dict[str, list[dict]] = {name: [] for name in every}
    for i in range(pairs):
        for name, (config, patched) in every.items():
            seed = i if temperature > 0 else 0
            with patched(), modeled_seconds() as totals:
                result = measure(model, ids, seed=seed, triforce_config=config, **cache_kwargs(prefix.copy()), **kwargs)
            runs[name].append(1e3 * result.decode_seconds_per_token)
            modeled[name].append(1e3 * totals[0] / max(totals[1], 1))
            counts[name].append(call_counts(result.stats))
    ms = {name: statistics.median(values) for name, values in runs.items()}
    ratios = {f"{name}_over_fixed": ms["fixed"] / ms[name] for name in every if name != "fixed"}
    logger.info("%s T=%s: %s %s", prompt.name, temperature, runs, {k: round(v, 2) for k, v in ratios.items()})
    logger.info("modeled ms/token: %s", {k: [round(x, 1) for x in v] for k, v in modeled.items()})
    return {
        "prompt": prompt.name,
        "temperature": temperature,
        "ms_per_token": runs,
        "modeled_ms_per_token": modeled,
        "counts": counts,
        **ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--variants", default="full", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    variants = args.variants.split(",")
    rows = [row(model, tokenizer, p, t, args.pairs, variants) for p in BENCH_PROMPTS for t in (0.0, 0.6)]
    result = {
        "command": f"python -m research.planner_variants --variants {args.variants} --pairs {args.pairs}",
        "machine": machine_info(),
        "rows": rows,
    }
    if args.output:
        write_json(result, args.output, indent=1)


if __name__ == "__main__":
    main()
