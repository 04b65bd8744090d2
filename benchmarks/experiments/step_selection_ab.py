"""Per-step re-selection (``TriForceConfig.step_selection``) against the default, on a copy-task split (issue 18).

Every task of ``hf_triforce.evaluation.drafts.copy_tasks`` (4 passage kinds x 5 depths, 6K-token prompts) is
generated with the real ``generate()`` call (greedy, 64 new tokens, ``drafter="none"`` as the issue measures level
1 alone) under each mode and budget. Reported from ``hf_triforce.last_stats``: level 1's per-token acceptance
(accepted / (accepted + rejections), pooled over the kinds of a depth), decoding tokens per second (the prefill
excluded), and what one re-ranking costs beside one level-1 forward.

Modes: ``default`` (TriForceConfig's defaults: one selection per ``refresh_every`` tokens, chunks ranked by their
mean keys) and ``step`` (``step_selection=True``: each refresh ranks every chunk by its keys and nominates 4 x the
view's room; inside every level-1 forward, each of the later half of the layers ranks the nominees with its own query
before it attends, and the view swaps in the chunks that changed); ``step-r8`` and ``step-r12``: ``step`` with
``refresh_every`` 8 and 12 instead of 4 (fewer refreshes; measured on the tune split,
``benchmarks/results/step-selection-tune-refresh.md``). The selection's cost per level-1 forward is reported as the
refreshes' time spread over the forwards plus the re-ranking inside them.

``--natural N`` adds ``N`` natural continuations of the language reference (``eval-drafts``' natural prompts), and
``--genres N`` ``N`` raw slices of each of the four haystacks (``hf_triforce.evaluation.common.haystacks``: a technical
manual, code, a how-to guide, release notes; spread evenly through each), both run also as ``streaming``
(``recent_window = budget - 16``: the sink chunk, the one retrieved chunk the config requires, and the most recent
tokens; StreamingLLM's view but for that chunk): the issue asks retrieval never to fall below StreamingLLM on natural
text.

Run: ``.venv/bin/python benchmarks/experiments/step_selection_ab.py --split heldout --natural 3 --output
benchmarks/results/X.json`` (about 35 minutes on 2 CPU threads; ``--split '' --natural 3`` for the natural
prompts alone; ``--split '' --genres 2 --new-tokens 128`` for the genres, per prompt; ``--only reference#0,guide#0``
runs those prompts alone; ``--drafter auto`` runs the whole hierarchy with the default level 0 instead of level 1
alone; ``--fixed-schedule`` turns the planner off, ``adaptive=False``, so that every round drafts ``gamma2`` tokens
whatever the timings: a rerun drafts the same positions, and a per-prompt difference between modes is the
selection's, not the machine's); ``--report X.json [Y.json ...]`` prints the markdown of one or more runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import sys
import time

import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.common.documents import read_document
from hf_triforce.evaluation.common.haystacks import HAYSTACKS, haystack_text
from hf_triforce.evaluation.common.loading import load_model
from hf_triforce.evaluation.common.machine import device_line, machine_info
from hf_triforce.evaluation.drafts.copy_tasks import build_copy_prompt, copy_task_specs
from hf_triforce.evaluation.drafts.tasks import natural_task

CTX, NEW, BUDGETS = 6144, 64, (384, 768)
MODES = {
    "default": {},
    "step": {"step_selection": True},
    "step-r8": {"step_selection": True, "refresh_every": 8},
    "step-r12": {"step_selection": True, "refresh_every": 12},
    "rescore4": {"rescore_candidates": 4},  # the mean keys nominate 4 k chunks, ranked by their keys at each refresh
    "streaming": {},  # natural prompts only: recent_window = budget - 16 (the sink, one retrieved chunk, the window)
}


def measure(model, ids, budget: int, mode: str, new: int = NEW, drafter: str = "none", adaptive: bool = True) -> dict:
    """One greedy call of ``new`` tokens; level 1's counts and the decoding and re-ranking times."""
    options = {"recent_window": budget - 16} if mode == "streaming" else MODES[mode]
    cfg = TriForceConfig(retrieval_budget=budget, drafter=drafter, adaptive=adaptive, **options)
    model.generate(ids, max_new_tokens=new, do_sample=False, triforce_config=cfg)
    st = hf_triforce.last_stats(model)
    secs, calls = st.phases.seconds, st.phases.calls
    reselect = secs.get("reselect", 0.0)
    return dict(
        acc=st.level1.accepted, rej=st.level1.rejections, tokens=st.new_tokens,
        decode_s=st.seconds - st.prefill_seconds, reselect_ms=1e3 * reselect / max(1, calls.get("level1", 0)),
        refresh_ms=1e3 * secs.get("refresh", 0.0) / max(1, calls.get("level1", 0)),
        level1_ms=1e3 * (secs.get("level1", 0.0) - reselect) / max(1, calls.get("level1", 0)),
    )  # fmt: skip


def tasks(
    tokenizer, split: str, natural: int, genres: int = 0, new: int = NEW
) -> list[tuple[str, str, float | None, torch.Tensor]]:
    """``(name, kind, depth, ids)``: the split's copy tasks, then ``natural`` continuations of the language reference
    (``eval-drafts``' natural prompts: raw slices at ``i / natural`` of the way in), then ``genres`` raw slices of
    each haystack (:func:`genre_prompts`); every prompt ``CTX - new`` tokens."""
    texts, document, length = {}, read_document(None), CTX - new
    copies = [(s.name, s.kind, s.depth, build_copy_prompt(tokenizer, s, length, texts).input_ids)
              for s in (copy_task_specs(split) if split else [])]  # fmt: skip
    prompts = [natural_task(tokenizer, document, i, natural, length) for i in range(natural)]
    return copies + [(t.name, "natural", None, t.prompt) for t in prompts] + genre_prompts(tokenizer, genres, length)


def genre_prompts(tokenizer, count: int, length: int) -> list[tuple[str, str, None, torch.Tensor]]:
    """``count`` slices of ``length`` tokens of each haystack (``name#i``, kind ``natural``), their starts spread evenly
    from the text's first token to the last start that leaves ``length`` tokens."""
    out = []
    for name in sorted(HAYSTACKS) if count else ():
        ids = tokenizer(haystack_text(name), add_special_tokens=False).input_ids
        for i in range(count):
            start = (len(ids) - length) * i // max(1, count - 1)
            out.append((f"{name}#{i}", "natural", None, torch.tensor([ids[start : start + length]])))
    return out


def run(
    split: str,
    output: str,
    modes: list[str],
    natural: int,
    genres: int = 0,
    new: int = NEW,
    only: str = "",
    drafter: str = "none",
    adaptive: bool = True,
) -> None:
    model, tokenizer = load_model(None)
    hf_triforce.enable(model)
    rows, start = [], time.time()
    result = {"split": split, "drafter": drafter, "adaptive": adaptive, "machine": machine_info(),
              "command": _command(), "rows": rows}  # fmt: skip
    for name, kind, depth, ids in tasks(tokenizer, split, natural, genres, new):
        if only and name not in only.split(","):
            continue
        for budget in BUDGETS:
            for mode in modes + (["streaming"] if kind == "natural" else []):
                row = dict(name=name, kind=kind, depth=depth, budget=budget, mode=mode)
                rows.append(dict(row, **measure(model, ids, budget, mode, new, drafter, adaptive)))
        print(f"{name}: {time.time() - start:.0f} s", flush=True)
        json.dump(result, open(output, "w"), indent=1)


def report(paths: list[str]) -> str:
    """Markdown of one or more runs' rows (the first run's split and machine): per-token acceptance per mode, budget
    and depth (and on natural text, beside StreamingLLM); decoding speed and re-ranking cost."""
    runs = [json.load(open(path)) for path in paths]
    rec = {**runs[0], "rows": [r for run in runs for r in run["rows"]]}
    copies = [r for r in rec["rows"] if r["kind"] != "natural"]
    where = f"the copy tasks ({rec['split']} split)" if copies else "natural text"
    lines = [
        f"# Per-step re-selection on {where}, greedy, {_levels(rec.get('drafter', 'none'))}"
        + ("" if rec.get("adaptive", True) else ", fixed schedule (`adaptive=False`: gamma2 drafts every round)"),
        "",
        device_line(rec),
        "",
        "Command: " + "; ".join(f"`{run['command']}`" for run in runs),
        "",
        "Level-1 per-token acceptance (`last_stats(model).level1.per_token_acceptance`, pooled: on copy tasks over "
        "the 4 passage kinds of a depth) and decoding speed (new tokens / decoding seconds, the prefill excluded; the "
        "median over the tasks, robust to a task slowed by other work on the machine).",
        "",
    ]
    depths = sorted({r["depth"] for r in copies})
    for budget in BUDGETS if copies else ():
        lines += [f"Budget {budget} (1/{CTX // budget} of the context):", ""]
        lines += _table(copies, budget, [(f"{d:g}", d) for d in depths], "worst depth") + [""]
    natural = [r for r in rec["rows"] if r["kind"] == "natural"]
    if natural:
        sources = {r.get("name", "natural#").startswith("natural#") for r in natural}  # True: eval-drafts' prompts
        what = " and ".join(["continuations of the language reference"] * (True in sources)
                            + ["raw slices of the four haystacks"] * (False in sources))  # fmt: skip
        lines += [f"Natural text, {what} ({len(natural) // len(_keys(natural))} prompts; `streaming`: `recent_window "
                  "= budget - 16`, the sink chunk, one retrieved chunk and the window), pooled:", ""]  # fmt: skip
        lines += _table(natural, None, [(f"1/{CTX // b}", b) for b in BUDGETS], "worst") + [""]
        lines += _per_prompt(natural)
    lines += _costs(rec["rows"])
    return "\n".join(lines)


def _levels(drafter: str) -> str:
    """What ran: level 1 alone (``drafter="none"``), or the whole hierarchy with that level-0 drafter."""
    return "level 1 alone" if drafter == "none" else f"drafter={drafter!r} (levels 0, 1 and 2)"


def _keys(rows: list[dict]) -> set:
    return {(r["budget"], r["mode"]) for r in rows}


def _table(rows: list[dict], budget: int | None, columns: list[tuple[str, object]], worst: str) -> list[str]:
    """One row per mode: acceptance per column (a depth at ``budget``, or a budget when ``budget`` is None)."""
    pooled, speeds = collections.defaultdict(collections.Counter), collections.defaultdict(list)
    for r in rows:
        key = r["budget"] if budget is None else r["depth"]
        if budget is None or r["budget"] == budget:
            for column in (key, "all"):
                pooled[(r["mode"], column)].update(acc=r["acc"], rej=r["rej"])
            speeds[r["mode"]].append(r["tokens"] / max(1e-9, r["decode_s"]))
    lines = ["| mode | " + " | ".join(c[0] for c in columns) + f" | {worst} | decode tok/s (median) |"]
    lines += ["|---|" + "---:|" * (len(columns) + 2)]
    for mode in [m for m in MODES if (m, "all") in pooled]:
        rates = [_rate(pooled[(mode, c[1])]) for c in columns]
        speed = _median(speeds[mode])
        lines.append(f"| {mode} | " + " | ".join(f"{v:.3f}" for v in rates) + f" | {min(rates):.3f} | {speed:.1f} |")
    return lines


def _per_prompt(rows: list[dict]) -> list[str]:
    """Per natural prompt and budget, each mode's per-token acceptance (rejections in brackets); runs that recorded
    no prompt names have none."""
    named = [r for r in rows if r.get("name")]
    modes = [m for m in MODES if any(r["mode"] == m for r in named)]
    if not named:
        return []
    lines = ["Per prompt (`natural#i`: the i-th continuation, `name#i`: slice i of that haystack; rejections in "
             "brackets):", ""]  # fmt: skip
    lines += ["| prompt | budget | " + " | ".join(modes) + " |", "|---|---:|" + "---:|" * len(modes)]
    cells = {(r["name"], r["budget"], r["mode"]): r for r in named}
    for name in dict.fromkeys(r["name"] for r in named):
        for budget in BUDGETS:
            got = [cells.get((name, budget, m)) for m in modes]
            lines.append(f"| {name} | 1/{CTX // budget} | " + " | ".join(
                "-" if r is None else f"{_rate(r):.3f} ({r['rej']})" for r in got) + " |")  # fmt: skip
    return lines + [""]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _costs(rows: list[dict]) -> list[str]:
    """Per mode, medians over the tasks of the selection's cost per level-1 forward (the refreshes' time spread over
    the forwards, and the re-ranking inside them) beside the forward itself."""
    lines = []
    for mode in [m for m in MODES if m != "streaming"]:
        costs = [(r.get("refresh_ms"), r["reselect_ms"], r["level1_ms"]) for r in rows if r["mode"] == mode]
        if costs and costs[0][0] is not None:
            refresh, res, step = (_median([c[i] for c in costs]) for i in (0, 1, 2))
            lines += [f"{mode}: per level-1 forward (medians over tasks), refreshes {refresh:.1f} ms and re-ranking "
                      f"{res:.1f} ms, against {step:.1f} ms for the forward without re-ranking.", ""]  # fmt: skip
        elif costs:
            res, step = (_median([c[i] for c in costs]) for i in (1, 2))
            lines += [f"{mode}: re-ranking per level-1 forward (median over tasks) {res:.1f} ms, the forward "
                      f"without it {step:.1f} ms.", ""]  # fmt: skip
    return lines


def _rate(c) -> float:
    return c["acc"] / max(1, c["acc"] + c["rej"])


def _command() -> str:
    return "benchmarks/experiments/step_selection_ab.py " + shlex.join(sys.argv[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="heldout", help="copy-task split ('': none, natural prompts only)")
    parser.add_argument("--output", default="step-selection.json")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--modes", default="default,step", help="comma-separated: default, step")
    parser.add_argument("--natural", type=int, default=0, help="natural continuations to add (streaming compared)")
    parser.add_argument("--genres", type=int, default=0, help="raw slices of each haystack to add (streaming compared)")
    parser.add_argument("--new-tokens", type=int, default=NEW, help="new tokens per call (the prompt: 6144 - this)")
    parser.add_argument(
        "--drafter", default="none", help="TriForceConfig.drafter (none: level 1 alone; auto: the default)"
    )
    parser.add_argument("--only", default="", help="comma-separated prompt names to run (e.g. reference#0), or all")
    parser.add_argument("--fixed-schedule", action="store_true", help="adaptive=False: no timing-dependent planner")
    parser.add_argument("--report", nargs="+", help="JSON results to print as one markdown report")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(args.threads)
    run(
        args.split,
        args.output,
        args.modes.split(","),
        args.natural,
        args.genres,
        args.new_tokens,
        args.only,
        args.drafter,
        not args.fixed_schedule,
    )


if __name__ == "__main__":
    main()
