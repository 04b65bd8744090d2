"""Tutorial: question answering over a long document, TriForce against plain ``generate()``.

Cuts the Python language reference to ~7K tokens, asks a question whose answer sits in the middle of
it, and measures plain ``generate()`` and TriForce in the same process on the same prompt (prefill
excluded, after a warm-up) with :func:`hf_triforce.evaluation.bench.compare`.

Run:
    .venv/bin/python examples/long_document_qa.py                 # ~7K-token document, ~2 min on 2 CPU cores
    .venv/bin/python examples/long_document_qa.py --document my.txt --question "..." --tokens 6000
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/long_document_qa.py   # ~1K tokens, ~20 s

Prints (promised output):
    Answer: ...
    decode speed: plain ... tok/s, TriForce ... tok/s, speedup ...x
    identical text: yes
"""

from __future__ import annotations

import argparse
import logging
import os

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.bench import compare
from hf_triforce.evaluation.common.documents import question_prompt, read_document
from hf_triforce.evaluation.common.smollm2 import load_smollm2

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
QUESTION = "Using only the document above: what do the 'async with' and 'async for' statements do?"

logger = logging.getLogger("long_document_qa")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--document", default=None, help="UTF-8 text file (default: the Python reference)")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--tokens", type=int, default=1000 if SMALL else 7000, help="document tokens to keep")
    parser.add_argument("--new-tokens", type=int, default=24 if SMALL else 128)
    parser.add_argument("--budget", type=int, default=256 if SMALL else 512, help="retrieval_budget")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_smollm2()
    limit = model.config.max_position_embeddings  # the document is cut so prompt + answer fit
    ids = question_prompt(tokenizer, read_document(args.document), args.question, args.tokens, limit, args.new_tokens)
    logger.info("prompt: %d tokens; plain generate() first, then TriForce", ids.shape[1])

    config = TriForceConfig(retrieval_budget=args.budget)
    result = compare(model, ids, config, max_new_tokens=args.new_tokens, do_sample=False)  # enables TriForce
    stats = hf_triforce.last_stats(model)

    answer = tokenizer.decode(result.triforce.sequences[0, ids.shape[1] :], skip_special_tokens=True)
    print("Answer:", answer.strip())
    print(f"prompt: {ids.shape[1]} tokens, retrieval budget: {args.budget} tokens")
    print(
        f"decode speed: plain {result.plain.tokens_per_second:.1f} tok/s, "
        f"TriForce {result.triforce.tokens_per_second:.1f} tok/s, speedup {result.speedup:.2f}x"
    )
    print(f"level-1 (retrieval) acceptance: {stats.level1.acceptance_rate:.2f}")
    print(f"tokens per full-cache forward: {stats.mean_accepted_length:.2f}")
    print("identical text:", "yes" if result.identical else "NO")


if __name__ == "__main__":
    main()
