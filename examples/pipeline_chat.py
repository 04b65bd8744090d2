"""Tutorial: TriForce through ``pipeline("text-generation")`` with chat messages.

``triforce_config`` is an ordinary generate keyword, so a pipeline forwards it to the model's
``generate()``; everything else (chat template, decoding, ``return_full_text``) is the pipeline's own.
``--model`` takes any other supported causal LM with a chat template (default: the embedded SmolLM2-135M-Instruct).

Run:
    .venv/bin/python examples/pipeline_chat.py                               # ~25 s on 2 CPU cores
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/pipeline_chat.py   # ~10 s

Prints (promised output):
    Pipeline answer: ...
    tokens per full-cache forward: ...
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from pydoc_data.topics import topics  # the Python language reference, shipped with CPython: a long offline text

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

import hf_triforce
from hf_triforce import TriForceConfig

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 96
QUESTION = "Using only the document above: what does an assignment statement do with a target list?"
# The embedded SmolLM2-135M-Instruct: `make venv` converts it once into this directory (docs/installation.md).
EMBEDDED = Path(os.environ.get("HF_TRIFORCE_CACHE", "~/.cache/hf_triforce")).expanduser() / "smollm2-135m-instruct"

logger = logging.getLogger("pipeline_chat")


def load(path: str):
    """The model (float32, eval mode) and its tokenizer, from a ``save_pretrained`` directory or a hub name."""
    if path == str(EMBEDDED) and not EMBEDDED.is_dir():
        raise SystemExit(f"no model in {EMBEDDED}: `make venv` converts the embedded SmolLM2 there; or pass --model")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def first_tokens(tokenizer, text: str, n: int) -> str:
    """The first ``n`` tokens of ``text``, as text."""
    ids = tokenizer(text[: 8 * n], add_special_tokens=False).input_ids[:n]
    return tokenizer.decode(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=str(EMBEDDED), help="model directory or hub name (default: SmolLM2)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load(args.model)
    hf_triforce.enable(model)  # before or after building the pipeline: it patches this model instance
    chat = pipeline("text-generation", model=model, tokenizer=tokenizer)

    document = first_tokens(tokenizer, "\n\n".join(topics[key] for key in sorted(topics)), DOCUMENT_TOKENS)
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
