"""Tutorial: a multi-turn chat about a long document, each turn continuing from the cache the last one returned.

Turn 1 asks about a document; turn 2 renders the whole conversation with the chat template and passes turn 1's
returned cache (``return_dict_in_generate=True``), so only the new message is prefilled, not the document
again. The same conversation with plain ``generate()`` (the same cache reuse) gives the same text. ``--model``
takes any other supported causal LM with a chat template (default: the embedded SmolLM2-135M-Instruct).

Run:
    .venv/bin/python examples/multi_turn_chat.py                               # ~3K-token document, ~1 min
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/multi_turn_chat.py   # ~600 tokens, ~15 s

Prints (promised output):
    Turn 1: ...
    Turn 2: ...
    turn 2 prefilled ... of ... prompt tokens (the rest came from turn 1's cache)
    identical to plain generate(): True
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from pydoc_data.topics import topics  # the Python language reference, shipped with CPython: a long offline text

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_triforce
from hf_triforce import TriForceConfig

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 96
TURNS = (
    "Using only the document above: what does an assignment statement do with a target list?",
    "Give one short example of it in Python code.",
)
# transformers 5.24 renamed the cache argument past_key_values to cache (and the generate output's field).
CACHE = "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"
# The embedded SmolLM2-135M-Instruct: `make venv` converts it once into this directory (docs/installation.md).
EMBEDDED = Path(os.environ.get("HF_TRIFORCE_CACHE", "~/.cache/hf_triforce")).expanduser() / "smollm2-135m-instruct"

logger = logging.getLogger("multi_turn_chat")


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


def converse(model, tokenizer, document: str, **generate_kwargs):
    """Both turns of the conversation, each reusing the cache the previous turn returned.

    Returns the messages, the last turn's sequences, and per turn its prompt's tokens and how many it prefilled.
    """
    messages, sequences, cache, prompts, prefilled = [], None, None, [], []
    for i, text in enumerate(TURNS):
        messages.append({"role": "user", "content": f"{document}\n\n{text}" if i == 0 else text})
        chat = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids, reuse = chat["input_ids"], {}
        if cache is not None:
            # Re-rendering the last answer can differ from the generated tokens at its end (the template adds its
            # end-of-turn tokens): keep the cached tokens the new prompt starts with, and at least one to prefill.
            cached = sequences[0, : cache.get_seq_length()]
            n = min(len(cached), ids.shape[1] - 1)
            differs = (cached[:n] != ids[0, :n]).nonzero()
            keep = int(differs[0]) if len(differs) else n
            if keep < cache.get_seq_length():
                cache.crop(keep - cache.get_seq_length())  # negative: the number of tokens to remove
            reuse = {CACHE: cache}
        prompts.append(ids.shape[1])
        prefilled.append(ids.shape[1] - (cache.get_seq_length() if cache is not None else 0))
        with torch.inference_mode():
            out = model.generate(ids, return_dict_in_generate=True, **reuse, **generate_kwargs)
        sequences, cache = out.sequences, getattr(out, CACHE)
        answer = tokenizer.decode(sequences[0, ids.shape[1] :], skip_special_tokens=True).strip()
        messages.append({"role": "assistant", "content": answer})
    return messages, sequences, prompts, prefilled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=str(EMBEDDED), help="model directory or hub name (default: SmolLM2)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load(args.model)
    hf_triforce.enable(model)
    document = first_tokens(tokenizer, "\n\n".join(topics[key] for key in sorted(topics)), DOCUMENT_TOKENS)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    config = TriForceConfig(retrieval_budget=256, gamma2=6)
    logger.info("chatting about a %d-token document: TriForce, then plain generate()", DOCUMENT_TOKENS)
    fast, fast_sequences, prompts, prefilled = converse(model, tokenizer, document, triforce_config=config, **kwargs)
    plain, plain_sequences, _, _ = converse(model, tokenizer, document, **kwargs)

    for i, message in enumerate(fast[1::2], start=1):
        print(f"Turn {i}:", message["content"])
    print(f"turn 2 prefilled {prefilled[1]} of {prompts[1]} prompt tokens (the rest came from turn 1's cache)")
    same = fast == plain and torch.equal(fast_sequences, plain_sequences)
    print(f"identical to plain generate(): {same}")


if __name__ == "__main__":
    main()
