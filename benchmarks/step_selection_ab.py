"""Per-step re-selection (``TriForceConfig.step_selection``) against the default, on a copy-task split (issue 18).

Every task of ``hf_triforce.evaluation.drafts.copy_tasks`` (4 passage kinds x 5 depths, 6K-token prompts) is
generated with the real ``generate()`` call (greedy, 64 new tokens, ``drafter="none"`` as the issue measures level
1 alone) under each mode and budget. Reported from ``hf_triforce.last_stats``: level 1's per-token acceptance
(accepted / (accepted + rejections), pooled over the kinds of a depth), decoding tokens per second (the prefill
excluded), and what one re-ranking costs beside one level-1 forward.

Modes: ``default`` (TriForceConfig's defaults: one selection per ``refresh_every`` tokens, chunks ranked by their
mean keys) and ``step-x4`` (``step_selection=True, rescore_candidates=4``: ranked again before every level-1 step,
by their keys).

Run: ``.venv/bin/python benchmarks/step_selection_ab.py --split heldout --output benchmarks/results/X.json``
(about 30 minutes on 2 CPU threads); ``--report X.json`` prints the markdown.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.common.loading import load_model
from hf_triforce.evaluation.common.machine import device_line, machine_info
from hf_triforce.evaluation.drafts.copy_tasks import build_copy_prompt, copy_task_specs

CTX, NEW, BUDGETS = 6144, 64, (384, 768)
MODES = {"default": {}, "step-x4": {"step_selection": True, "rescore_candidates": 4}}


def measure(model, ids, budget: int, mode: str) -> dict:
    """One greedy call; level 1's counts and the decoding and re-ranking times."""
    cfg = TriForceConfig(retrieval_budget=budget, drafter="none", **MODES[mode])
    model.generate(ids, max_new_tokens=NEW, do_sample=False, triforce_config=cfg)
    st = hf_triforce.last_stats(model)
    secs, calls = st.phases.seconds, st.phases.calls
    reselect = secs.get("reselect", 0.0)
    return dict(
        acc=st.level1.accepted, rej=st.level1.rejections, tokens=st.new_tokens,
        decode_s=st.seconds - st.prefill_seconds, reselect_ms=1e3 * reselect / max(1, calls.get("reselect", 0)),
        level1_ms=1e3 * (secs.get("level1", 0.0) - reselect) / max(1, calls.get("level1", 0)),
    )  # fmt: skip


def run(split: str, output: str) -> None:
    model, tokenizer = load_model(None)
    hf_triforce.enable(model)
    texts, rows, start = {}, [], time.time()
    result = {"split": split, "machine": machine_info(), "command": _command(), "rows": rows}
    for spec in copy_task_specs(split):
        ids = build_copy_prompt(tokenizer, spec, CTX - NEW, texts).input_ids
        for budget in BUDGETS:
            for mode in MODES:
                rows.append(dict(kind=spec.kind, depth=spec.depth, budget=budget, mode=mode,
                                 **measure(model, ids, budget, mode)))  # fmt: skip
        print(f"{spec.name}: {time.time() - start:.0f} s", flush=True)
        json.dump(result, open(output, "w"), indent=1)


def report(path: str) -> str:
    """Markdown: per-token acceptance per mode, budget and depth; decoding speed and re-ranking cost."""
    rec = json.load(open(path))
    pooled = collections.defaultdict(lambda: collections.Counter())
    for r in rec["rows"]:
        for depth in (r["depth"], "all"):
            pooled[(r["budget"], r["mode"], depth)].update(
                acc=r["acc"], rej=r["rej"], tokens=r["tokens"], decode_s=r["decode_s"]
            )
    depths = sorted({r["depth"] for r in rec["rows"]})
    lines = [
        f"# Per-step re-selection on the copy tasks ({rec['split']} split), greedy, level 1 alone",
        "",
        device_line(rec),
        "",
        f"Command: `{rec['command']}`",
        "",
        "Level-1 per-token acceptance (`last_stats(model).level1.per_token_acceptance`, pooled over the 4 passage "
        "kinds of a depth) and decoding speed (new tokens / decoding seconds, the prefill excluded, all tasks).",
        "",
    ]
    for budget in BUDGETS:
        lines += [f"Budget {budget} (1/{CTX // budget} of the context):", ""]
        lines += ["| mode | " + " | ".join(f"{d:g}" for d in depths) + " | worst depth | decode tok/s |"]
        lines += ["|---|" + "---:|" * (len(depths) + 2)]
        for mode in MODES:
            rates = [_rate(pooled[(budget, mode, d)]) for d in depths]
            total = pooled[(budget, mode, "all")]
            speed = total["tokens"] / max(1e-9, total["decode_s"])
            cells = " | ".join(f"{v:.3f}" for v in rates)
            lines.append(f"| {mode} | {cells} | {min(rates):.3f} | {speed:.1f} |")
        lines.append("")
    costs = [(r["reselect_ms"], r["level1_ms"]) for r in rec["rows"] if r["mode"] == "step-x4"]
    if costs:
        res, step = (sorted(c[i] for c in costs)[len(costs) // 2] for i in (0, 1))
        lines += [f"step-x4: one re-ranking (median over tasks) {res:.1f} ms, one level-1 forward {step:.1f} ms."]
    return "\n".join(lines)


def _rate(c) -> float:
    return c["acc"] / max(1, c["acc"] + c["rej"])


def _command() -> str:
    return "benchmarks/step_selection_ab.py " + " ".join(sys.argv[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="heldout")
    parser.add_argument("--output", default="step-selection.json")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(args.threads)
    run(args.split, args.output)


if __name__ == "__main__":
    main()
