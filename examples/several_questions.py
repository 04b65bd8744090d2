"""Tutorial: several questions about one long document, the document prefilled once into a cache.

The transformers pattern for a shared prefix: prefill it into a ``DynamicCache`` once, ``copy.deepcopy`` it
per question and pass the copy as the cache; only each question's own tokens are prefilled. TriForce takes
the same cache. Timed three ways in one process (plain ``generate()`` without reuse, plain ``generate()``
with reuse, TriForce with reuse), with :func:`hf_triforce.evaluation.bench.questions.ask_questions`.

Run:
    .venv/bin/python examples/several_questions.py                               # ~7K tokens, 4 questions, ~5 min
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/several_questions.py   # ~1K tokens, 2 questions, ~30 s

Prints (promised output):
    Q1: ...
    identical text: yes
    end to end: plain ... s, plain + reuse ... s, TriForce + reuse ... s
    TriForce + reuse: ...x plain + reuse, ...x plain without reuse
"""

from __future__ import annotations

import argparse
import logging
import os

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.bench.questions import DEFAULT_QUESTIONS, ask_questions
from hf_triforce.evaluation.common.documents import question_prompt, read_document
from hf_triforce.evaluation.common.smollm2 import load_smollm2

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"

logger = logging.getLogger("several_questions")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--document", default=None, help="UTF-8 text file (default: the Python reference)")
    parser.add_argument("--tokens", type=int, default=1000 if SMALL else 7000, help="document tokens to keep")
    parser.add_argument("--questions", type=int, default=2 if SMALL else 4, help="how many questions to ask")
    parser.add_argument("--new-tokens", type=int, default=24 if SMALL else 128)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    document, questions = read_document(args.document), DEFAULT_QUESTIONS[: args.questions]
    limit = model.config.max_position_embeddings
    prompts = [question_prompt(tokenizer, document, q, args.tokens, limit, args.new_tokens) for q in questions]
    logger.info("%d questions about a %d-token document", len(prompts), prompts[0].shape[1])

    config = TriForceConfig(retrieval_budget=256 if SMALL else 512)
    result = ask_questions(model, prompts, config, max_new_tokens=args.new_tokens, do_sample=False)

    for i, (question, ids) in enumerate(zip(questions, prompts, strict=True), start=1):
        answer = result.answers["triforce_reuse"][i - 1].run.sequences[0, ids.shape[1] :]
        print(f"Q{i}: {question}\nA{i}: {tokenizer.decode(answer, skip_special_tokens=True).strip()}")
    same = all(result.identical("plain", "plain_reuse")) and all(result.identical("plain", "triforce_reuse"))
    print(f"identical text: {'yes' if same else 'NO'}")
    total = {m: result.end_to_end_seconds(m) for m in result.answers}
    print(f"end to end: plain {total['plain']:.1f} s, plain + reuse {total['plain_reuse']:.1f} s, "
          f"TriForce + reuse {total['triforce_reuse']:.1f} s")  # fmt: skip
    print(f"TriForce + reuse: {total['plain_reuse'] / total['triforce_reuse']:.2f}x plain + reuse, "
          f"{total['plain'] / total['triforce_reuse']:.2f}x plain without reuse")  # fmt: skip


if __name__ == "__main__":
    main()
