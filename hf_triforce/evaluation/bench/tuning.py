"""One-knob-at-a-time sweep of ``TriForceConfig`` on a real model: acceptance, tokens per forward, speed.

Every row changes one knob of a baseline config (the demo's: ``retrieval_budget=512``, n-gram level 0)
and runs TriForce on the same long prompt, greedy, with a fixed number of new tokens. Plain
``generate()`` runs once on the same prompt as the reference for speed and for token equality. The
result feeds the tuning guide of the documentation (``hf_triforce.evaluation.figures.plots``).

Run it with ``python -m hf_triforce.evaluation.bench.tuning --output benchmarks/results/cpu-smollm2-tuning.json``
(``make tuning``). Speed figures are only comparable within one run and only when no other process
takes the cores torch's threads use: each measurement records how many cores its threads lacked
(``cores_lacked``) and is repeated when that is high. ``--threads 1`` keeps a sweep measurable beside
another single-threaded job on a 2-core machine. Acceptance and tokens per forward (greedy) do not
depend on the load.

Example:
    >>> [row["value"] for row in sweep_plan()["gamma2"]]
    [2, 4, 6, 8, 12]
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...config import TriForceConfig
from ...generation import enable
from ..common.documents import question_prompt, read_document
from ..common.formatting import acceptances
from ..common.generate_kwargs import generate_kwargs
from ..common.machine import machine_info
from ..common.results import write_json
from ..common.smollm2 import load_smollm2
from .contention import MAX_CORES_LACKED, measure_quietly
from .timed_run import RunResult, measure, warm_up

logger = logging.getLogger(__name__)

BASELINE: dict[str, Any] = {"retrieval_budget": 512, "drafter": "ngram"}
WARM_UP_PROMPT_TOKENS = 700

# knob -> values; every other knob keeps its baseline (TriForceConfig default) value.
KNOBS: dict[str, list[Any]] = {
    "retrieval_budget": [128, 256, 512, 1024, 2048],
    "chunk_size": [4, 8, 16, 32],
    "gamma2": [2, 4, 6, 8, 12],
    "gamma1": [1, 2, 4],
    "refresh_every": [1, 4, 8, 32, 1024],
    "drafter": ["none", "ngram", "model"],
    "draft_acceptance_floor": [0.0, 0.15, 0.5],
}


def sweep_plan(knobs: dict[str, list[Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """``{knob: [{"value": v, "config": TriForceConfig kwargs}, ...]}`` for each knob and value."""
    plan = {}
    for knob, values in (knobs or KNOBS).items():
        plan[knob] = [{"value": v, "config": {**BASELINE, knob: v}} for v in values]
    return plan


def run_tuning(
    prompt_tokens: int,
    new_tokens: int,
    document: str | None = None,
    on_row: Callable[[dict], None] | None = None,
    retry_passes: int = 2,
) -> dict[str, Any]:
    """Measure every row of :func:`sweep_plan` on SmolLM2-135M-Instruct; returns the JSON-ready results.

    The ``drafter="model"`` row uses a second instance of the same weights as the level-0 model (a
    stand-in: no smaller model with SmolLM2's vocabulary is available offline). Rows that ran while
    other processes kept the CPU busy are measured again after the sweep (up to ``retry_passes``
    times, keeping the quietest run); ``on_row(results)`` is called with the results so far.
    """
    model, tokenizer = load_smollm2()
    enable(model)
    ids = question_prompt(tokenizer, read_document(document), document_tokens=prompt_tokens, reserve=new_tokens)
    kwargs = generate_kwargs(new_tokens, min_new_tokens=new_tokens)
    warm_up(model, ids, TriForceConfig(**BASELINE), kwargs, prompt_tokens=WARM_UP_PROMPT_TOKENS)
    plain, plain_busy = measure_quietly(lambda: measure(model, ids, **kwargs))
    results = {
        "title": "TriForceConfig tuning sweep (one knob at a time)",
        "command": "python -m hf_triforce.evaluation.bench.tuning " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "prompt_tokens": ids.shape[1],
        "new_tokens": new_tokens,
        "baseline": TriForceConfig(**BASELINE).to_dict(),
        "plain": {**plain.to_dict(), "cores_lacked": plain_busy},
        "rows": [],
    }
    draft = _DraftModel()
    runs = []  # (knob, value, config, extra generate kwargs) per row
    for knob, entries in sweep_plan().items():
        for entry in entries:
            config = TriForceConfig(**entry["config"])
            runs.append((knob, entry["value"], config, draft.kwargs(config)))
            results["rows"].append(_measure_row(model, ids, kwargs, plain, *runs[-1]))
            if on_row is not None:
                on_row(results)
    for _ in range(retry_passes):  # re-measure the rows that ran beside another busy process
        for i, row in enumerate(results["rows"]):
            if (row["cores_lacked"] or 0.0) > MAX_CORES_LACKED:
                again = _measure_row(model, ids, kwargs, plain, *runs[i])
                if (again["cores_lacked"] or 0.0) < row["cores_lacked"]:
                    results["rows"][i] = again
                    if on_row is not None:
                        on_row(results)
    end, end_busy = measure_quietly(lambda: measure(model, ids, **kwargs))
    results["plain_at_end"] = {**end.to_dict(), "cores_lacked": end_busy}
    return results


class _DraftModel:
    """The level-0 model of the ``drafter="model"`` rows, loaded on first use."""

    def __init__(self) -> None:
        self.model = None

    def kwargs(self, config: TriForceConfig) -> dict[str, Any]:
        if config.drafter != "model":
            return {}
        if self.model is None:
            self.model = load_smollm2()[0]
        return {"assistant_model": self.model}


def _measure_row(model, ids, kwargs, plain: RunResult, knob: str, value: Any, config: TriForceConfig, extra: dict):
    run, busy = measure_quietly(lambda: measure(model, ids, triforce_config=config, **extra, **kwargs), attempts=1)
    row = _row(knob, value, config, run, plain, busy)
    logger.info("%s=%s: %s", knob, value, row["summary"])
    return row


def _row(
    knob: str, value: Any, config: TriForceConfig, run: RunResult, plain: RunResult, busy: float | None
) -> dict[str, Any]:
    stats = run.stats
    levels = stats["levels"]
    speedup = plain.decode_seconds_per_token / run.decode_seconds_per_token
    return {
        "knob": knob,
        "value": value,
        "config": config.to_dict(),
        "identical_output": bool(torch.equal(run.sequences, plain.sequences)),
        "tokens_per_second": run.tokens_per_second,
        "speedup": speedup,
        "level0_acceptance": levels["level0"]["acceptance_rate"] if levels["level0"]["drafted"] else None,
        "level1_acceptance": levels["level1"]["acceptance_rate"],
        "tokens_per_forward": stats["mean_accepted_length"],
        "level1_forwards_per_token": stats["phases"].get("level1", {}).get("calls", 0) / stats["new_tokens"],
        "cores_lacked": busy,  # see contention.measure_quietly
        "triforce": stats,
        "summary": f"{speedup:.2f}x, level-1 acc. {acceptances(levels['level1'])} (round / per token), "
        f"{stats['mean_accepted_length']:.2f} tokens/forward",
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hf_triforce.evaluation.bench.tuning [--prompt-tokens N] [--new-tokens N] --output PATH``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prompt-tokens", type=int, default=4000, help="document tokens in the prompt")
    parser.add_argument("--new-tokens", type=int, default=96, help="tokens generated per run")
    parser.add_argument("--document", default=None, help="UTF-8 text file (default: the Python reference)")
    parser.add_argument("--output", required=True, help="JSON file to write")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # 1 thread is not slowed down much by another busy process
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    def write(results: dict[str, Any]) -> None:
        write_json(results, args.output)

    write(run_tuning(args.prompt_tokens, args.new_tokens, args.document, on_row=write))
    logger.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
