"""The markdown report of ``hf-triforce eval-drafts`` results: setup, must-show verdicts, one section per measure.

Figures come pooled from :mod:`.summary`; the figure beside the report is
:func:`hf_triforce.evaluation.figures.drafts_plot.write_eval_plot`.

Example:
    >>> paths = write_eval_results(results, "benchmarks/results/eval-drafts.json")  # doctest: +SKIP
    >>> [p.suffix for p in paths]  # doctest: +SKIP
    ['.json', '.md']
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ...config import TriForceConfig
from ..common.formatting import acceptances, number
from ..common.machine import device_name, library_versions
from ..common.results import write_json
from .summary import (
    KIND_ORDER,
    NEEDLE_TARGET,
    budget_label,
    budget_tokens,
    copy_kinds,
    copy_verdict,
    drafter_cost,
    fraction_label,
    level0_pooled,
    margin_interval,
    mean_refreshes,
    passage_task_kind,
    per_token,
    pooled,
    round_rate,
    verdicts,
)
from .view_policy import CONFIG_KNOBS


def write_eval_results(results: dict[str, Any], path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``results`` as strict JSON (NaN as null) and the markdown report beside it; returns both paths.

    Example:
        >>> write_eval_results(run_eval_drafts(EvalOptions()), "benchmarks/results/eval-drafts.json")  # doctest: +SKIP
        (PosixPath('benchmarks/results/eval-drafts.json'), PosixPath('benchmarks/results/eval-drafts.md'))
    """
    path = write_json(results, path, indent=1, strict=True)
    md = path.with_suffix(".md")
    md.write_text(markdown_report(results))
    return path, md


def markdown_report(results: dict[str, Any]) -> str:
    """The markdown page: setup, must-show verdicts, then one section per measurement."""
    m = results["machine"]
    o = results["options"]
    lines = [
        f"# {results['title']}",
        "",
        f"Device: {device_name(m)}. {library_versions(m)}; {m['date']}; "
        f"{results.get('seconds', float('nan')) / 60:.1f} minutes.",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Prompts of up to {o['context_tokens'] - o['new_tokens']} tokens, continuations of up to {o['new_tokens']} "
        f"tokens; budgets {', '.join(fraction_label(f) for f in o['budget_fractions'])} of {o['context_tokens']} "
        "tokens; "
        f"temperatures {', '.join(f'{t:g}' for t in o['temperatures'])} (top-p {o['top_p']:g}). Level-1 acceptance is "
        "measured per position against the full-cache model along a reference continuation (greedy at T=0, sampled "
        "otherwise): argmax agreement at T=0, the exact speculative-sampling acceptance sum_x min(p, p_hat) at T>0. "
        "Every view sees its selection plus the tokens cached since; the generator's rounds of gamma2 = "
        f"{results['config_defaults']['gamma2']} drafts are replayed along the reference and a view is re-selected at "
        f"the start of a round once {results['config_defaults']['refresh_every']} tokens were cached since its last "
        f"selection (the defaults). StreamingLLM keeps {o['streaming_sinks']} sinks and the most recent tokens, as "
        "many as the retrieval budget, on the same refresh schedule.",
    ]
    lines += _verdict_section(results)
    lines += _natural_section(results)
    lines += _needle_section(results)
    lines += _copy_section(results)
    lines += _round_section(results)
    lines += _ablation_section(results)
    lines += _defaults_section(results)
    lines += _level0_section(results)
    lines += _end_to_end_section(results)
    lines += _reference_section(results)
    return "\n".join(lines) + "\n"


def _verdict_section(results: dict[str, Any]) -> list[str]:
    v = verdicts(results)
    headline = fraction_label(results["options"]["headline_fraction"])
    needle = ", ".join(f"{d}: {x['retrieval']:.3f} vs {x['streaming']:.3f}" for d, x in v["needle"].items())
    worst = min(v["natural"].items(), key=lambda kv: kv[1]["retrieval"] - kv[1]["streaming"], default=None)
    lines = ["", "## Must-show checks", ""]
    if passage_task_kind(results) == "copy":
        lines += _copy_verdict_lines(results)
    elif not v["needle"]:
        lines.append("- Needle tasks: not measured (no needle depths).")
    else:
        lines.append(
            f"- Needle tasks, budget {headline}, T=0, retrieval >= {NEEDLE_TARGET} at every depth: "
            f"**{'met' if v['needle_met'] else 'NOT met'}** (depth: retrieval vs StreamingLLM: {needle})."
        )
    lines += [
        f"- Natural continuation, retrieval >= StreamingLLM at every budget and temperature: "
        f"**{'met' if v['natural_met'] else 'NOT met'}**",
    ]
    if worst is not None:
        key, x = worst
        lines[-1] += f" (smallest margin {x['retrieval'] - x['streaming']:+.3f} at budget {key}{_spread(x)})."
    return lines


def _spread(x: dict[str, Any]) -> str:
    """``: -2 of 768 positions; per prompt ahead on 3, behind on 4, even on 5, from -2 to +1 positions`` (empty
    when no prompt has both views), and from three prompts on ``; the prompts resampled, 95 % of the margins lie
    from -9 to +5`` (:func:`~hf_triforce.evaluation.drafts.summary.margin_interval`)."""
    margins = x.get("prompt_margins")
    if not margins:
        return ""
    ahead, behind = sum(m > 0 for m in margins), sum(m < 0 for m in margins)
    digits = 0 if all(float(m).is_integer() for m in margins) else 1  # T > 0: expected positions
    total, low, high = (f"{v:+.{digits}f}" for v in (sum(margins), min(margins), max(margins)))
    line = (
        f": {total} of {x['positions']} positions; per prompt ahead on {ahead}, behind on {behind}, "
        f"even on {len(margins) - ahead - behind}, from {low} to {high} positions"
    )
    if len(margins) < 3:
        return line
    lo, hi = margin_interval(margins)
    return line + f"; the prompts resampled, 95 % of the margins lie from {lo:+.{digits}f} to {hi:+.{digits}f}"


def _copy_verdict_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for label, b in copy_verdict(results)["budgets"].items():
        depths = ", ".join(f"{d}: {x['retrieval']:.3f} vs {x['streaming']:.3f}" for d, x in b["depths"].items())
        lines.append(
            f"- Copy tasks ({_split(results)} split), budget {label}, T=0, per-token retrieval acceptance >= "
            f"{b['target']} at every depth: **{'met' if b['met'] else 'NOT met'}** (worst {number(b['worst'])}; "
            f"depth: retrieval vs StreamingLLM: {depths})."
        )
    return lines


def _split(results: dict[str, Any]) -> str:
    return results["options"].get("copy_split") or "?"


def _copy_section(results: dict[str, Any]) -> list[str]:
    if passage_task_kind(results) != "copy":
        return []
    o = results["options"]
    main = [r for r in results["views"] if r["group"] == "main" and r["task_kind"] == "copy"]
    kinds = copy_kinds(results)
    haystacks = sorted({t["haystack"] for t in results["tasks"] if t["kind"] == "copy"})
    lines = [
        "",
        f"## Copy tasks ({_split(results)} split): per-token level-1 acceptance at T=0",
        "",
        f"A random passage of each kind ({', '.join(kinds)}) at each depth of a haystack ({', '.join(haystacks)}), "
        "asked for with one of the split's wordings, the answer started with its first words "
        "(hf_triforce.evaluation.drafts.copy_tasks). Per-token acceptance is accepted / (accepted + rejections) over "
        "the replayed rounds of gamma2 drafts (TriForceStats' `per_token_acceptance`, the papers' alpha); the "
        "full model's own answer is the reference, including where it stops copying.",
    ]
    for fraction in o["budget_fractions"]:
        lines += [
            "",
            f"Budget {budget_label(results, fraction)}:",
            "",
            "| depth | " + " | ".join(kinds) + " | all kinds | StreamingLLM (all) |",
            "|---|" + "---:|" * (len(kinds) + 2),
        ]
        for depth in o["needle_depths"]:
            args = dict(budget_fraction=fraction, temperature=0.0, depth=depth)
            cells = [number(per_token(main, kind="retrieval", passage_kind=k, **args)) for k in kinds]
            cells += [number(per_token(main, kind=k, **args)) for k in KIND_ORDER]
            lines.append(f"| {depth:g} | " + " | ".join(cells) + " |")
    return lines + _copied_table(results, kinds)


def _copied_table(results: dict[str, Any], kinds: list[str]) -> list[str]:
    """How much of each T=0 reference answer the full model copied from the passage (per kind and depth)."""
    copied = {r["task"]: r.get("needle_overlap") for r in results["references"] if r["temperature"] == 0}
    tasks = [t for t in results["tasks"] if t["kind"] == "copy"]
    lines = [
        "",
        "Did the full model copy? The share of its T=0 answer's token 4-grams found in the passage (1.00: it copied "
        "throughout; lower: it stopped copying and wrote text of its own, which level 1 must then predict like "
        "natural text), and the haystack of each task:",
        "",
        "| depth | " + " | ".join(kinds) + " |",
        "|---|" + "---:|" * len(kinds),
    ]
    for depth in results["options"]["needle_depths"]:
        cells = []
        for kind in kinds:
            task = next((t for t in tasks if t["passage_kind"] == kind and t["depth"] == depth), None)
            value = float("nan") if task is None else copied.get(task["name"], float("nan"))
            cells.append(f"{number(value, 2)} ({task['haystack'] if task else '-'})")
        lines.append(f"| {depth:g} | " + " | ".join(cells) + " |")
    return lines


def _natural_section(results: dict[str, Any]) -> list[str]:
    o = results["options"]
    main = [r for r in results["views"] if r["group"] == "main"]
    temps = o["temperatures"]
    lines = [
        "",
        "## Natural continuation of the document: level-1 acceptance by budget",
        "",
        f"Pooled over {_natural_prompts(o)}; retrieval / StreamingLLM.",
        "",
        *_temperature_columns("budget", temps),
    ]
    for fraction in o["budget_fractions"]:
        cells = [number(pooled(main, task_kind="natural", budget_fraction=fraction, temperature=t, kind=kind)[0])
                 for t in temps for kind in KIND_ORDER]  # fmt: skip
        lines.append(f"| {budget_label(results, fraction)} | " + " | ".join(cells) + " |")
    return lines + _haystack_table(results, main)


def _natural_prompts(options: dict[str, Any]) -> str:
    """What the natural prompts were: ``"3 prompt(s) (raw document text)"`` or the haystacks' slices."""
    haystacks = options.get("natural_haystacks") or []
    if not haystacks:
        return f"{options['natural_prompts']} prompt(s) (raw document text)"
    each = options["natural_prompts"]
    return f"{each * len(haystacks)} prompts (raw text, {each} slice(s) of each haystack: {', '.join(haystacks)})"


def _haystack_table(results: dict[str, Any], main: list[dict[str, Any]]) -> list[str]:
    """Natural text per haystack and budget, when the prompts came from several haystacks."""
    haystacks = results["options"].get("natural_haystacks") or []
    if len(haystacks) < 2:
        return []
    temps = results["options"]["temperatures"]
    lines = ["", "Per haystack:", "", *_temperature_columns("haystack | budget", temps, before="|---|---|")]
    for name in haystacks:
        for fraction in results["options"]["budget_fractions"]:
            match = dict(task_kind="natural", haystack=name, budget_fraction=fraction)
            cells = [number(pooled(main, **match, temperature=t, kind=kind)[0]) for t in temps for kind in KIND_ORDER]
            lines.append(f"| {name} | {budget_label(results, fraction)} | " + " | ".join(cells) + " |")
    return lines


def _needle_section(results: dict[str, Any]) -> list[str]:
    if not any(t["kind"] == "needle" for t in results["tasks"]):  # copy tasks, or natural prompts alone
        return []
    o = results["options"]
    main = [r for r in results["views"] if r["group"] == "main"]
    refs = {(r["task"], r["temperature"]): r for r in results["references"]}
    tasks = {t["name"]: t for t in results["tasks"] if t["kind"] == "needle"}
    temps = o["temperatures"]
    lines = [
        "",
        f"## Needle tasks: level-1 acceptance by depth (budget {budget_label(results, o['headline_fraction'])})",
        "",
        "A passage of real words placed at a token depth of the document; the prompt asks for it word for word and "
        "starts the answer with its first words, so the correct continuation copies it from the middle of the "
        "document. `copied` is the fraction of the greedy reference answer's token 4-grams found in the passage "
        "(the full model really copies it when this is high).",
        "",
        *_temperature_columns("depth | copied (T=0)", temps, before="|---|---:|"),
    ]
    for name, task in tasks.items():
        cells = []
        for t in temps:
            for kind in KIND_ORDER:
                args = dict(task=name, budget_fraction=o["headline_fraction"], temperature=t, kind=kind)
                cells.append(number(pooled(main, **args)[0]))
        ref = refs.get((name, 0.0), {})
        copied = number(ref.get("needle_overlap", float("nan")), 2)
        lines.append(f"| {task['depth']:g} ({task['actual_depth']:.3f}) | {copied} | " + " | ".join(cells) + " |")
    lines += ["", "All budgets at T=0 (retrieval / StreamingLLM):", ""]
    lines += ["| depth | " + " | ".join(budget_label(results, f) for f in o["budget_fractions"]) + " |"]
    lines += ["|---|" + "---:|" * len(o["budget_fractions"])]
    for name, task in tasks.items():
        cells = []
        for f in o["budget_fractions"]:
            r, s = (pooled(main, task=name, budget_fraction=f, temperature=0.0, kind=k)[0] for k in KIND_ORDER)
            cells.append(f"{number(r)} / {number(s)}")
        lines.append(f"| {task['depth']:g} | " + " | ".join(cells) + " |")
    return lines


def _round_section(results: dict[str, Any]) -> list[str]:
    o = results["options"]
    main = [r for r in results["views"] if r["group"] == "main" and r["budget_fraction"] == o["headline_fraction"]]
    temps = o["temperatures"]
    lines = [
        "",
        f"## Replayed rounds at budget {budget_label(results, o['headline_fraction'])}: "
        "accepted / drafted level-1 tokens",
        "",
        "The statistic `hf_triforce.last_stats(model)` reports for level 1 (compare with the end-to-end section): "
        "every round drafts gamma2 tokens and the drafts after the first rejection count as rejected, so it is "
        "lower than the per-position acceptance above.",
        "",
        *_temperature_columns("task", temps),
    ]
    measured = {t["kind"] for t in results["tasks"]}
    for kind in [k for k in ("natural", passage_task_kind(results)) if k in measured]:
        cells = [number(round_rate(main, task_kind=kind, temperature=t, kind=k)) for t in temps for k in KIND_ORDER]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return lines


def _ablation_section(results: dict[str, Any]) -> list[str]:
    rows = [r for r in results["views"] if r["group"] == "ablation"]
    if not rows:
        return []
    o = results["options"]
    temps = o["temperatures"]
    defaults = _policy_defaults(results)
    passage = passage_task_kind(results)
    header = " | ".join(f"natural T={t:g} | {passage} T={t:g}" for t in temps)
    lines = [
        "",
        f"## Selection policy ablations (budget {budget_label(results, o['headline_fraction'])}, one knob at a time)",
        "",
        f"Every other knob keeps its TriForceConfig default (marked *). `{passage} min` is the worst depth at T=0 "
        "(per-token acceptance for copy tasks); `all` pools every position of every task and temperature.",
        "",
        f"| knob | value | {header} | {passage} min T=0 | all | refreshes |",
        "|---|---|" + "---:|---:|" * len(temps) + "---:|---:|---:|",
    ]
    for knob in dict.fromkeys(r["knob"] for r in rows):
        for value in dict.fromkeys(_key(r["value"]) for r in rows if r["knob"] == knob):
            chosen = [r for r in rows if r["knob"] == knob and _key(r["value"]) == value]
            cells = []
            for t in temps:
                cells += [number(pooled(chosen, task_kind=k, temperature=t)[0]) for k in ("natural", passage)]
            worst = _worst_depth(chosen, passage)
            refreshes = mean_refreshes(chosen)
            mark = "*" if defaults.get(knob) == value else ""
            lines.append(
                f"| {knob} | {_show(knob, value)}{mark} | "
                + " | ".join(cells)
                + f" | {number(worst)} | {number(pooled(chosen)[0])} | {refreshes:.1f} |"
            )
    return lines


def _worst_depth(rows: list[dict[str, Any]], passage: str) -> float:
    """The worst T=0 figure over depths: per-position needle acceptance, or per-token copy acceptance (pooled
    over passage kinds)."""
    depths = {r["depth"] for r in rows if r["task_kind"] == passage}
    if passage == "copy":
        return min((per_token(rows, task_kind="copy", depth=d, temperature=0.0) for d in depths), default=math.nan)
    return min((pooled(rows, task_kind="needle", depth=d, temperature=0.0)[0] for d in depths), default=math.nan)


def _level0_section(results: dict[str, Any]) -> list[str]:
    rows = results["level0"]
    if not rows:
        return []
    o = results["options"]
    temps = o["temperatures"]
    passage = passage_task_kind(results)
    lines = [
        "",
        "## Level-0 drafters against level 1 (retrieval view at the headline budget)",
        "",
        "One proposal per position along the same references: `acc` is the mean acceptance of the proposed "
        "tokens by level 1 (argmax agreement at T=0, p_hat(x) or sum min(q, p_hat) at T>0), `cov` the fraction of "
        "positions with a proposal (n-gram lookup proposes only after a suffix match). `model-kL` is the target's "
        "first k layers + final norm + LM head with a StreamingLLM cache (training-free; no small model sharing "
        "the tokenizer is available offline); its forward costs about k / num_layers of a level-1 step.",
        "",
        "| drafter | " + " | ".join(f"natural T={t:g} acc (cov) | {passage} T={t:g} acc (cov)" for t in temps) + " |",
        "|---|" + "---:|---:|" * len(temps),
    ]
    for name in dict.fromkeys(r["drafter"] for r in rows):
        cells = []
        for t in temps:
            for kind in ("natural", passage):
                acc, cov, _ = level0_pooled(rows, drafter=name, task_kind=kind, temperature=t)
                cells.append(f"{number(acc)} ({number(cov, 2)})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + _level0_value_section(results)


def _level0_value_section(results: dict[str, Any]) -> list[str]:
    rows = results["level0"]
    layers = results.get("num_layers")
    passage = passage_task_kind(results)
    lines = [
        "",
        "Is a level-0 drafter worth its cost? With one proposal per level-1 step (gamma1 = 1), a step yields "
        "1 + a tokens (a = accepted level-0 tokens per position) and costs 1 + c level-1 steps (c = the drafter's "
        "cost; the slightly wider level-1 forward is ignored), so level 1 runs (1 + a) / (1 + c) times as fast "
        "(> 1: worth it). Pooled over temperatures.",
        "",
        f"| drafter | cost c | natural a | {passage} a | natural (1+a)/(1+c) | {passage} (1+a)/(1+c) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in dict.fromkeys(r["drafter"] for r in rows):
        c = drafter_cost(name, layers)
        a = {kind: level0_pooled(rows, drafter=name, task_kind=kind)[2] for kind in ("natural", passage)}
        a = {k: (0.0 if name == "none" else v) for k, v in a.items()}
        value = {k: (1 + v) / (1 + c) for k, v in a.items()}
        lines.append(
            f"| {name} | {number(c, 2)} | {number(a['natural'])} | {number(a[passage])} | "
            f"{number(value['natural'], 2)} | {number(value[passage], 2)} |"
        )
    return lines


def _defaults_section(results: dict[str, Any]) -> list[str]:
    """Each ablated knob: its TriForceConfig default next to the best measured value."""
    rows = [r for r in results["views"] if r["group"] == "ablation"]
    if not rows:
        return []
    defaults = _policy_defaults(results)
    lines = [
        "",
        "## TriForceConfig defaults against these measurements",
        "",
        "Best value of each ablated knob by the pooled acceptance over every task, temperature and position "
        "(`all`) and by the worst needle depth at T=0; values within 0.005 of the best count as a tie. `combine` is "
        "not a config knob (hf_triforce.kernels.retrieval.score_chunks sums the group's queries). Lower refresh "
        "strides cost one re-selection per stride (its time is the `refresh` phase of hf-triforce bench).",
        "",
        "| knob | default | `all` at default | best `all` | best needle min T=0 | default is best (`all`) |",
        "|---|---|---:|---|---|---|",
    ]
    for knob in dict.fromkeys(r["knob"] for r in rows):
        values = list(dict.fromkeys(_key(r["value"]) for r in rows if r["knob"] == knob))
        chosen = {v: [r for r in rows if r["knob"] == knob and _key(r["value"]) == v] for v in values}
        overall = {v: pooled(c)[0] for v, c in chosen.items()}
        worst = {v: _worst_depth(c, passage_task_kind(results)) for v, c in chosen.items()}
        best = max(overall, key=overall.get)
        best_needle = max(worst, key=lambda v: -1 if math.isnan(worst[v]) else worst[v])
        default = defaults.get(knob)
        at_default = overall.get(default, float("nan"))
        tie = not math.isnan(at_default) and at_default >= overall[best] - 0.005
        lines.append(
            f"| {knob} | {_show(knob, default)} | {number(at_default)} | "
            f"{_show(knob, best)} ({number(overall[best])}) | "
            f"{_show(knob, best_needle)} ({number(worst[best_needle])}) | "
            f"{'yes' if tie else f'no (best +{overall[best] - at_default:.3f})'} |"
        )
    return lines + [
        "",
        "Not measured here: `retrieval_budget` (its default, 4096, is meant for long contexts; budgets here are "
        "fractions of the context), `gamma1`, `gamma2`, `draft_cache_budget`, `draft_sinks`, `ngram_max`, "
        "`ngram_min`, `draft_acceptance_floor` and `prefill_chunk_size` (speed and memory knobs: see "
        "hf_triforce.evaluation.bench.tuning). `drafter`: see the level-0 section.",
    ]


def _end_to_end_section(results: dict[str, Any]) -> list[str]:
    rows = results["end_to_end"]
    if not rows:
        return []
    lines = [
        "",
        "## End to end: TriForce generate() with each level-0 drafter",
        "",
        f"Shorter prompts ({results['options']['e2e_context_tokens']}-token context), "
        f"{results['options']['e2e_new_tokens']} new tokens, budget = the headline fraction of the context, other "
        "knobs at their TriForceConfig defaults; per-level acceptance from `hf_triforce.last_stats(model)`. "
        "Level 1 is lossless whatever level 0 does, so its acceptance should not depend on the drafter: at T=0 the "
        "rows of a task match exactly; at T>0 each row is one sample whose random draws (and so output) differ "
        "with the drafter. Seconds are wall time on a shared CPU (indicative only).",
        "",
        "| task | T | drafter | level-0 acc. round / per token (drafted) | level-1 acc. round / per token (drafted) | "
        "tokens / verification | "
        "level-1 steps | refreshes | seconds | same greedy text |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    greedy = {}
    for r in rows:
        if r["temperature"] == 0:
            greedy.setdefault(r["task"], r["tokens"])
    for r in rows:
        s = r["stats"]
        draft, level1 = s["levels"]["level0"], s["levels"]["level1"]
        d = f"{acceptances(draft, 3)} ({draft['drafted']})" if draft["drafted"] else "-"
        steps = s["phases"].get("level1", {}).get("calls", 0)
        same = ("yes" if r["tokens"] == greedy[r["task"]] else "NO") if r["temperature"] == 0 else "n/a"
        lines.append(
            f"| {r['task']} | {r['temperature']:g} | {r['drafter']} | {d} | {acceptances(level1, 3)} "
            f"({level1['drafted']}) | {s['mean_accepted_length']:.2f} | {steps} | {s['retrieval_refreshes']} | "
            f"{r['seconds']:.1f} | {same} |"
        )
    return lines


def _reference_section(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Reference continuations (full-cache model)",
        "",
        "| task | T | tokens | copied | text |",
        "|---|---:|---:|---:|---|",
    ]
    for r in results["references"]:
        text = " ".join(r["text"].split())[:110].replace("|", "\\|")
        copied = number(r.get("needle_overlap", float("nan")), 2)
        lines.append(f"| {r['task']} | {r['temperature']:g} | {r['new_tokens']} | {copied} | {text} |")
    return lines


def _temperature_columns(first: str, temperatures: list[float], before: str = "|---|") -> list[str]:
    """Header and alignment rows of a table with a retrieval and a StreamingLLM column per temperature."""
    columns = " | ".join(f"T={t:g} retrieval | T={t:g} streaming" for t in temperatures)
    return [f"| {first} | {columns} |", before + "---:|---:|" * len(temperatures)]


def _policy_defaults(results: dict[str, Any]) -> dict[str, Any]:
    """The default value of each ablated knob; results recorded before 0.2 name one knob ``refresh_below`` and have
    no ``lookahead_chunks`` (it was 0 then)."""
    c = dict(results["config_defaults"])
    if c.get("recent_window") == "auto":  # the window the ablations' base policy ran with
        headline = budget_tokens(results, results["options"]["headline_fraction"])
        c["recent_window"] = TriForceConfig(retrieval_budget=headline, chunk_size=c["chunk_size"]).recent_tokens
    defaults = {"combine": "sum", **{knob: _key(c.get(knob, 0)) for knob in CONFIG_KNOBS}}  # 0.1: no lookahead
    return {**defaults, "refresh_below": defaults["refresh_below_acceptance"]}


def _key(value: Any) -> Any:
    return "none" if value is None else value


def _show(knob: str, value: Any) -> str:
    if value == "none":
        return "never" if knob == "refresh_every" else "off"
    return str(value)
