"""Tutorial: two-level TriForce without any draft model (``drafter="none"``).

With ``drafter="none"`` the target drafts for itself over its retrieval-selected sparse KV cache
(level 1) and the full cache verifies (level 2): self-speculation, no second model and no n-gram
table. The example runs it next to the default three-level n-gram setup and plain ``generate()``.

Run:
    .venv/bin/python examples/two_level.py                               # ~90 s on 2 CPU cores
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/two_level.py   # ~15 s

Prints (promised output): a table with one row per setup, then
    two levels (drafter='none') identical to plain generate(): True
"""

from __future__ import annotations

import logging
import os

import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.bench import measure
from hf_triforce.evaluation.common.documents import DEFAULT_QUESTION, question_prompt, read_document
from hf_triforce.evaluation.common.smollm2 import load_smollm2

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 4000
NEW_TOKENS = 24 if SMALL else 96
QUESTION = DEFAULT_QUESTION  # the demo's question, about __getattr__ and __getattribute__
BUDGET = 256 if SMALL else 512  # tokens of the KV cache level 1 reads: 1/8 of the full-size prompt
logger = logging.getLogger("two_level")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    input_ids = question_prompt(tokenizer, read_document(None), QUESTION, DOCUMENT_TOKENS)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    logger.info("prompt: %d tokens; plain generate(), then drafter='none' and 'ngram'", input_ids.shape[1])
    plain = measure(model, input_ids, **kwargs)  # timed with the prefill excluded
    print(f"{'setup':<26}{'level-0 acc.':>13}{'level-1 acc.':>13}{'tokens/forward':>16}{'tok/s':>8}")
    print(f"{'plain generate()':<26}{'-':>13}{'-':>13}{1.0:>16.2f}{plain.tokens_per_second:>8.1f}")
    outputs = {}
    for drafter in ("none", "ngram"):
        config = TriForceConfig(retrieval_budget=BUDGET, drafter=drafter)
        run = measure(model, input_ids, triforce_config=config, **kwargs)
        stats = hf_triforce.last_stats(model)
        level0 = f"{stats.level0.acceptance_rate:.2f}" if stats.level0.drafted else "-"
        name = "two levels (none)" if drafter == "none" else "three levels (ngram)"
        print(f"{name:<26}{level0:>13}{stats.level1.acceptance_rate:>13.2f}"
              f"{stats.mean_accepted_length:>16.2f}{run.tokens_per_second:>8.1f}")  # fmt: skip
        outputs[drafter] = run.sequences
    print("two levels (drafter='none') identical to plain generate():", torch.equal(outputs["none"], plain.sequences))
    same = torch.equal(outputs["ngram"], plain.sequences)
    print("three levels (drafter='ngram') identical to plain generate():", same)


if __name__ == "__main__":
    main()
