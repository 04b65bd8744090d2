"""Fingerprint of TriForce calls on tiny random models: sequences and per-level counts of a fixed matrix of calls.

Run it on two trees (before and after a change to the decoding loop) and compare the JSON files: with fixed
schedules (``adaptive=False``) and seeded sampling, a loop that consumes random numbers in the same order and
drafts the same tokens gives byte-identical output. Greedy cases also run with the adaptive planner (their text
cannot depend on the schedule); their counts are left out, as they follow the machine's timings.

    python benchmarks/experiments/loop_fingerprint.py --output /tmp/after.json
    python -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); \
        print([k for k in a if a[k]!=b.get(k)])" /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import hf_triforce  # noqa: E402
from hf_triforce import TriForceConfig  # noqa: E402
from tests.integration.conftest import build_model, random_prompt, repetitive_prompt  # noqa: E402

BASE = dict(retrieval_budget=48, chunk_size=8, recent_window=16, gamma1=2, gamma2=4, refresh_every=4)
SAMPLING = [dict(do_sample=True, temperature=0.9), dict(do_sample=True, top_k=5, temperature=1.2)]


def counts(model) -> dict:
    stats = hf_triforce.last_stats(model).to_dict()
    levels = {k: [v["drafted"], v["accepted"], v["rejections"]] for k, v in stats["levels"].items()}
    return {"levels": levels, "rounds": stats.get("rounds"), "forwards": stats["target_forwards"]}


def cases():
    for drafter in ("none", "ngram", "suffix", "model"):
        for cfg_extra in ({}, {"cuda_graphs": "eager"}, {"level1_forward": "transformers"}, {"rescore_candidates": 0}):
            for kwargs in [dict(do_sample=False), *SAMPLING]:
                yield f"{drafter}-{cfg_extra}-{kwargs}", drafter, cfg_extra, kwargs, 1
    for extra in ({"level1_weights": "int4"}, {"level1_weights": "full"}, {"step_selection": True}):
        for kwargs in [dict(do_sample=False), SAMPLING[0]]:
            yield f"ngram-{extra}-{kwargs}", "ngram", extra, kwargs, 1
    for drafter in ("none", "ngram", "model"):
        for kwargs in [dict(do_sample=False), *SAMPLING]:
            yield f"batch3-{drafter}-{kwargs}", drafter, {}, kwargs, 3
            yield f"padded1-{drafter}-{kwargs}", drafter, {}, kwargs, -1


def run(name, drafter, extra, kwargs, batch, model, draft, out, adaptive):
    cfg = TriForceConfig(**BASE, drafter=drafter, adaptive=adaptive, **extra)
    prompt = repetitive_prompt(120, seed=3) if drafter in ("ngram", "suffix") else random_prompt(120, seed=3)
    call = dict(max_new_tokens=24, **kwargs)
    if drafter == "model":
        call["assistant_model"] = draft
    if batch == 3:
        rows = torch.cat([prompt, random_prompt(120, seed=4), prompt.roll(7, 1)])
        mask = torch.ones_like(rows)
        mask[1, :9] = 0
        call["attention_mask"] = mask
        prompt = rows
    elif batch == -1:
        call["attention_mask"] = torch.ones_like(prompt)
        call["attention_mask"][:, :5] = 0
    torch.manual_seed(1234)
    ids = model.generate(prompt, triforce_config=cfg, **call)
    entry = {"ids": ids.tolist()}
    if adaptive is False:
        entry["counts"] = counts(model)
    out[f"{name}-adaptive={adaptive}"] = entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, draft = build_model("llama_gqa", 2, 0), build_model("llama_gqa", 1, 100, enable=False)
    out: dict = {}
    for name, drafter, extra, kwargs, batch in cases():
        for adaptive in (False, True) if not kwargs.get("do_sample") else (False,):
            try:
                run(name, drafter, extra, kwargs, batch, model, draft, out, adaptive)
            except Exception as err:  # a refusal is part of the fingerprint
                out[f"{name}-adaptive={adaptive}"] = {"error": type(err).__name__}
    Path(args.output).write_text(json.dumps(out, indent=0, sort_keys=True))
    print(f"{len(out)} cases -> {args.output}")


if __name__ == "__main__":
    main()
