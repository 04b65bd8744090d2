"""Quickstart: TriForce inside ``model.generate()`` on a real model, checked against plain ``generate()``.

Asks SmolLM2-135M-Instruct (embedded, offline) a question about a slice of the Python language
reference, once with TriForce and once without, and prints the answer, whether both are identical and
what each TriForce level accepted.

Run:
    .venv/bin/python examples/quickstart.py                               # ~40 s on 2 CPU cores
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/quickstart.py   # smaller document, ~10 s

Prints (promised output):
    Answer: ...
    identical to plain generate(): True
    level-1 (retrieval) acceptance: ...
"""

from __future__ import annotations

import logging
import os

import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.common.documents import question_prompt, read_document
from hf_triforce.evaluation.common.smollm2 import load_smollm2

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 96
QUESTION = "What does the assert statement do, and when are assertions skipped?"

logger = logging.getLogger("quickstart")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_smollm2()  # float32, eval mode; any Llama/Mistral/Qwen2/Qwen3 causal LM works
    hf_triforce.enable(model)  # once per model; generate() without triforce_config is unchanged
    input_ids = question_prompt(tokenizer, read_document(None), QUESTION, DOCUMENT_TOKENS)  # [1, n] chat prompt
    logger.info("prompt: %d tokens", input_ids.shape[1])

    config = TriForceConfig(retrieval_budget=256)  # level 1 attends to 256 of the prompt's tokens
    with torch.inference_mode():
        fast = model.generate(input_ids, max_new_tokens=NEW_TOKENS, do_sample=False, triforce_config=config)
        stats = hf_triforce.last_stats(model)
        plain = model.generate(input_ids, max_new_tokens=NEW_TOKENS, do_sample=False)

    print("Answer:", tokenizer.decode(fast[0, input_ids.shape[1] :], skip_special_tokens=True).strip())
    print("identical to plain generate():", torch.equal(fast, plain))
    print(f"level-0 (n-gram) acceptance: {stats.level0.acceptance_rate:.2f}")
    print(f"level-1 (retrieval) acceptance: {stats.level1.acceptance_rate:.2f}")
    print(f"tokens per full-cache forward: {stats.mean_accepted_length:.2f} (plain generate(): 1.00)")


if __name__ == "__main__":
    main()
