"""Quickstart: TriForce inside ``model.generate()`` on a real model, checked against plain ``generate()``.

Asks SmolLM2-135M-Instruct (embedded, offline) a question about a slice of the Python language
reference, once with TriForce and once without, and prints the answer, whether both are identical and
what each TriForce level accepted. ``--model`` takes any other supported causal LM with a chat template.

Run:
    .venv/bin/python examples/quickstart.py                               # ~40 s on 2 CPU cores
    .venv/bin/python examples/quickstart.py --model ./my-model            # a save_pretrained directory
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/quickstart.py   # smaller document, ~10 s

Prints (promised output):
    Answer: ...
    identical to plain generate(): True
    level-1 (retrieval) acceptance: ...
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from pydoc_data.topics import topics  # the Python language reference, shipped with CPython: a long offline text

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_triforce
from hf_triforce import TriForceConfig

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 96
QUESTION = "What does the assert statement do, and when are assertions skipped?"
# The embedded SmolLM2-135M-Instruct: `make venv` converts it once into this directory (docs/installation.md).
EMBEDDED = Path(os.environ.get("HF_TRIFORCE_CACHE", "~/.cache/hf_triforce")).expanduser() / "smollm2-135m-instruct"

logger = logging.getLogger("quickstart")


def load(path: str):
    """The model (float32, eval mode) and its tokenizer, from a ``save_pretrained`` directory or a hub name."""
    if path == str(EMBEDDED) and not EMBEDDED.is_dir():
        raise SystemExit(f"no model in {EMBEDDED}: `make venv` converts the embedded SmolLM2 there; or pass --model")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def question_ids(tokenizer, document: str, question: str, tokens: int) -> torch.Tensor:
    """``[1, n]`` chat-template token ids asking ``question`` about the first ``tokens`` tokens of ``document``."""
    cut = tokenizer.decode(tokenizer(document[: 8 * tokens], add_special_tokens=False).input_ids[:tokens])
    messages = [{"role": "user", "content": f"{cut}\n\nQuestion: {question}"}]
    chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return chat["input_ids"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=str(EMBEDDED), help="model directory or hub name (default: SmolLM2)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load(args.model)
    hf_triforce.enable(model)  # once per model; generate() without triforce_config is unchanged
    document = "\n\n".join(topics[key] for key in sorted(topics))
    input_ids = question_ids(tokenizer, document, QUESTION, DOCUMENT_TOKENS)  # [1, n] chat prompt
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
