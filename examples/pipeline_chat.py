"""Tutorial: TriForce through ``pipeline("text-generation")`` with chat messages.

``triforce_config`` is an ordinary generate keyword, so a pipeline forwards it to the model's
``generate()``; everything else (chat template, decoding, ``return_full_text``) is the pipeline's own.

Run:
    .venv/bin/python examples/pipeline_chat.py                               # ~25 s on 2 CPU cores
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/pipeline_chat.py   # ~10 s

Prints (promised output):
    Pipeline answer: ...
    tokens per full-cache forward: ...
"""

from __future__ import annotations

import logging
import os

from transformers import pipeline

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.common.documents import read_document
from hf_triforce.evaluation.common.smollm2 import load_smollm2

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 96
QUESTION = "Using only the document above: what does an assignment statement do with a target list?"

logger = logging.getLogger("pipeline_chat")


def first_tokens(tokenizer, text: str, n: int) -> str:
    """The first ``n`` tokens of ``text``, as text."""
    ids = tokenizer(text[: 8 * n], add_special_tokens=False).input_ids[:n]
    return tokenizer.decode(ids)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)  # before or after building the pipeline: it patches this model instance
    chat = pipeline("text-generation", model=model, tokenizer=tokenizer)

    document = first_tokens(tokenizer, read_document(None), DOCUMENT_TOKENS)
    messages = [{"role": "user", "content": f"{document}\n\nQuestion: {QUESTION}"}]
    config = TriForceConfig(retrieval_budget=256, gamma2=6)
    logger.info("asking about a %d-token document", DOCUMENT_TOKENS)
    out = chat(messages, max_new_tokens=NEW_TOKENS, do_sample=False, return_full_text=False, triforce_config=config)

    stats = hf_triforce.last_stats(model)
    print("Pipeline answer:", out[0]["generated_text"].strip())
    print(f"new tokens: {stats.new_tokens}, full-cache forwards: {stats.target_forwards}")
    print(f"tokens per full-cache forward: {stats.mean_accepted_length:.2f} (plain generate(): 1.00)")


if __name__ == "__main__":
    main()
