"""A recent window that follows the retrieval budget, against the fixed 64 tokens and StreamingLLM (issue 18, item 1).

``hf-triforce eval-drafts`` measures level-1 acceptance along full-cache references for the default retrieval
policy and a StreamingLLM view of each budget; this script adds, at every budget, the default policy with a recent
window of 64 tokens and of an eighth, a quarter and a half of the budget (at least 64, whole chunks), on the same
references. Natural text is scored as eval-drafts scores it (per-position acceptance, pooled over prompts), copy
tasks per token (``per_token_acceptance``, pooled over the passage kinds of a depth). ``--variants ceiling``
measures instead of the windows the chunks ranked by the exact attention their refresh's query gives them (a
ceiling of chunk scoring, it reads every key; :func:`ceiling_rows`), ``--variants rescore`` the default with
``rescore_candidates`` (:func:`rescore_rows`), ``--variants refresh`` the default re-selecting less often and after
every round with a rejection (:func:`refresh_rows`; the tables add the refreshes per prompt or task).
``--haystacks`` takes the natural prompts from eval-drafts' ``--natural-haystacks`` instead of the reference.

Run (1 CPU thread each, about 35 minutes apiece on this machine):

    python benchmarks/experiments/recent_window_ab.py --natural 12 --output natural12.json
    python benchmarks/experiments/recent_window_ab.py --copy tune --context 6144 --budgets 1/16,1/8 --temps 0 \\
        --natural 3 --output tune.json
    python benchmarks/experiments/recent_window_ab.py --natural 12 --context 6144 --budgets 1/16,1/8 --temps 0 \\
        --output n6k.json
    python benchmarks/experiments/recent_window_ab.py --natural 12 --context 6144 --budgets 1/16 --temps 0 \\
        --variants ceiling --output ceiling.json  # or --variants rescore
    python benchmarks/experiments/recent_window_ab.py --copy heldout --context 6144 --budgets 1/16,1/8 --temps 0 \\
        --natural 0 --variants refresh --output refresh-heldout.json
    python benchmarks/experiments/recent_window_ab.py --report tune.json > tune.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from fractions import Fraction
from functools import partial

import torch

from hf_triforce import TriForceConfig
from hf_triforce.caches.selection import EVERY_CHUNK
from hf_triforce.evaluation.common.machine import device_line
from hf_triforce.evaluation.drafts import run as eval_run
from hf_triforce.evaluation.drafts.options import EvalOptions
from hf_triforce.evaluation.drafts.plan import default_policy, policy_plan
from hf_triforce.evaluation.drafts.summary import mean_refreshes, per_token, pooled

FRACTIONS = (8, 4, 2)  # recent window = budget // f, at least 64, whole chunks
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)


def window(budget: int, f: int, chunk: int = 8) -> int:
    """``budget // f`` rounded down to whole chunks, at least 64 (the old default)."""
    return max(64, budget // f // chunk * chunk)


def plan_with_variants(options: EvalOptions, variants: str = "windows") -> list:
    """eval-drafts' plan (default retrieval and StreamingLLM at every budget), then at every budget the policies of
    ``variants`` (:data:`VARIANTS`; a policy equal to another row's is measured once)."""
    rows = policy_plan(options)
    for fraction in options.budget_fractions:
        rows += VARIANTS[variants](default_policy(options.budget(fraction)), fraction)
    return rows


def window_rows(base, fraction: float) -> list:
    """The default policy with a recent window of 64 tokens and of an eighth, a quarter and a half of the budget."""
    windows = [64] + [window(base.budget, f) for f in FRACTIONS]
    return [("window", "recent_window", w, fraction, base.with_(recent_window=w)) for w in windows]


def ceiling_rows(base, fraction: float) -> list:
    """The chunks ranked by the exact attention mass the refresh's query gives them (eval-drafts'
    ``combine="attention"``: it reads every key, so a ceiling of chunk scoring rather than a policy) with a recent
    window of 0, 32 and the default's tokens, and the default summaries with no window: does any chunk selection
    beat StreamingLLM's contiguous window at this budget?"""
    rows = [("ceiling", "attention", w, fraction, base.with_(combine="attention", recent_window=w))
            for w in (0, 32, base.recent_window)]  # fmt: skip
    return rows + [("ceiling", "recent_window", 0, fraction, base.with_(recent_window=0))]


def rescore_rows(base, fraction: float) -> list:
    """The default policy with ``rescore_candidates`` 2, 4, 8 and every chunk (the candidates ranked by their keys'
    largest logit, :func:`~hf_triforce.caches.selection.rescore`), and 4 with a 32-token window."""
    rows = [("rescore", "rescore_candidates", x, fraction, base.with_(rescore_candidates=x))
            for x in (2, 4, 8, EVERY_CHUNK)]  # fmt: skip
    return rows + [("rescore", "rescore_w32", 4, fraction, base.with_(rescore_candidates=4, recent_window=32))]


def refresh_rows(base, fraction: float) -> list:
    """The default policy re-selecting less often: every 8 or 12 cached tokens instead of 4, and also after any round
    with a rejection (``refresh_below_acceptance=1.0``): fewer refreshes (issue 18, item 3) at what acceptance?"""
    return [("refresh", "refresh_every", n, fraction, base.with_(refresh_every=n, refresh_below_acceptance=1.0))
            for n in (8, 12)]  # fmt: skip


VARIANTS = {"windows": window_rows, "ceiling": ceiling_rows, "rescore": rescore_rows, "refresh": refresh_rows}
"""``--variants``: the policies measured beside eval-drafts' two at every budget."""


def _columns(views: list[dict], fraction: float) -> list[tuple[str, dict]]:
    """``(column name, row match)`` for one budget: each retrieval policy measured (the summaries' ranking by
    window, then re-scored, then the exact-attention ceiling), then StreamingLLM."""
    chosen = [r for r in views if r["budget_fraction"] == fraction and r["kind"] == "retrieval"]
    budget = chosen[0]["budget"]
    keys = sorted({_key(r) for r in chosen})
    out = [(_column(key, budget), {"label": next(r["label"] for r in chosen if _key(r) == key)}) for key in keys]
    return out + [("StreamingLLM", {"kind": "streaming"})]


def _key(row: dict) -> tuple[bool, int, int, int, float]:
    """``(whether the row ranks chunks by their exact attention, its rescore_candidates, its recent window, its
    refresh_every, its refresh_below_acceptance or -1)``."""
    policy = row["policy"]
    below = policy.get("refresh_below_acceptance")
    return (policy["combine"] == "attention", policy.get("rescore_candidates", 0), policy["recent_window"],
            policy.get("refresh_every", 4), -1.0 if below is None else below)  # fmt: skip


def _column(key: tuple[bool, int, int, int, float], budget: int) -> str:
    """``exact w32``, ``w96 (b/4, auto)``, ``x4 w96 (b/4, auto)``, ``x-all w96 (b/4, auto)``, ``... r8 below1``."""
    exact, rescore, w, every, below = key
    prefix = "exact " if exact else "x-all " if rescore == EVERY_CHUNK else f"x{rescore} " if rescore else ""
    refresh = "" if (every, below) == (4, -1.0) else f" r{every}" + (f" below{below:g}" if below >= 0 else "")
    return prefix + _name(w, budget) + refresh


def _name(w: int, budget: int) -> str:
    """``w96 (b/4, auto)``: the window, its share of the budget, and which default it is."""
    marks = [f"b/{budget // w}"] if w and budget % w == 0 else []
    marks += ["auto"] if w == TriForceConfig(retrieval_budget=budget).recent_tokens else []
    marks += ["old default"] if w == 64 else []
    return f"w{w}" + (f" ({', '.join(marks)})" if marks else "")


def report(results: dict) -> str:
    """The markdown of one run: natural text by budget and temperature, copy tasks by budget and depth."""
    views, o = results["views"], results["options"]
    keys = {_key(r) for r in views if r["kind"] == "retrieval"}
    scoring = len({k[:2] for k in keys}) > 1 or any(k[0] for k in keys)  # more than the windows varied
    what = "Chunk selection against StreamingLLM" if scoring else "Recent window against the budget"
    what = "Re-selection schedule" if len({k[3:] for k in keys}) > 1 else what
    lines = [f"# {what} (benchmarks/experiments/recent_window_ab.py)", "", f"{device_line(results)}", "",
             f"Command: `{results['command']}`", ""]  # fmt: skip
    if any(r["task_kind"] == "natural" for r in views):
        lines += _natural(views, o)
    if any(r["task_kind"] == "copy" for r in views):
        lines += _copy(views, o)
    return "\n".join(lines) + "\n"


def _natural(views: list[dict], o: dict) -> list[str]:
    title = f"## Natural continuations ({o['natural_prompts']} prompts, {o['context_tokens']}-token context)"
    lines = [title, "", "Per-position level-1 acceptance (eval-drafts' natural measure), pooled over the prompts.", ""]
    for fraction in o["budget_fractions"]:
        cols = _columns(views, fraction)
        budget = next(r["budget"] for r in views if r["budget_fraction"] == fraction)
        lines += [f"Budget {budget} ({Fraction(fraction).limit_denominator()}):", "",
                  "| T | " + " | ".join(c for c, _ in cols) + " |", "|---|" + "---:|" * len(cols)]  # fmt: skip
        for t in o["temperatures"]:
            match = dict(task_kind="natural", budget_fraction=fraction, temperature=t)
            cells = [pooled(views, **match, **m)[0] for _, m in cols]
            lines.append(f"| {t:g} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
        counts = [mean_refreshes(views, task_kind="natural", budget_fraction=fraction, **m) for _, m in cols]
        lines += ["| refreshes per prompt | " + " | ".join(f"{c:.1f}" for c in counts) + " |", ""]
    return lines


def _copy(views: list[dict], o: dict) -> list[str]:
    lines = [f"## Copy tasks ({o['copy_split']} split), T=0", ""]
    lines += ["Per-token level-1 acceptance by depth (the four passage kinds pooled), the worst depth, all depths.", ""]
    for fraction in o["budget_fractions"]:
        budget = next(r["budget"] for r in views if r["budget_fraction"] == fraction)
        header = "| window | " + " | ".join(f"{d:g}" for d in DEPTHS) + " | worst | all | refreshes per task |"
        lines += [f"Budget {budget} ({Fraction(fraction).limit_denominator()}):", "", header, "|---|" + "---:|" * 8]
        for name, m in _columns(views, fraction):
            d = [per_token(views, task_kind="copy", budget_fraction=fraction, depth=x, **m) for x in DEPTHS]
            every = per_token(views, task_kind="copy", budget_fraction=fraction, **m)
            refreshes = mean_refreshes(views, task_kind="copy", budget_fraction=fraction, **m)
            lines.append(f"| {name} | " + " | ".join(f"{x:.3f}" for x in d) + f" | {min(d):.3f} | {every:.3f} | "
                         f"{refreshes:.1f} |")  # fmt: skip
        lines.append("")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--copy", choices=["tune", "heldout"], help="copy-task split (default: natural text only)")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--budgets", default="1/16,1/8,1/4")
    p.add_argument("--temps", default="0,0.6,1")
    p.add_argument("--natural", type=int, default=12)
    p.add_argument("--haystacks", default="", help="eval-drafts --natural-haystacks (default '': the reference)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", help="results JSON to write")
    p.add_argument("--variants", choices=sorted(VARIANTS), default="windows", help="policies beside eval-drafts' two")
    p.add_argument("--report", help="results JSON to print as markdown")
    a = p.parse_args()
    if a.report:
        print(report(json.load(open(a.report))), end="")
        return
    torch.set_num_threads(a.threads)
    fractions = [float(Fraction(x)) for x in a.budgets.split(",")]
    options = EvalOptions(
        context_tokens=a.context, budget_fractions=fractions, temperatures=[float(t) for t in a.temps.split(",")],
        natural_prompts=a.natural, natural_haystacks=[h for h in a.haystacks.split(",") if h],
        needle_depths=list(DEPTHS) if a.copy else [], copy_split=a.copy, ablations=False,
        draft_layers=[], end_to_end=False, headline_fraction=1 / 8 if 1 / 8 in fractions else fractions[-1],
    )  # fmt: skip
    eval_run.policy_plan = partial(plan_with_variants, variants=a.variants)  # the eval's own loop, over these policies
    results = eval_run.run_eval_drafts(options, command=shlex.join(["python", *sys.argv]))
    json.dump(results, open(a.output, "w"))
    print(report(results), end="")


if __name__ == "__main__":
    main()
