"""Tutorial: a multi-turn chat about a long document, each turn continuing from the cache the last one returned.

Turn 1 asks about a document; turn 2 renders the whole conversation with the chat template and passes turn 1's
returned cache (``return_dict_in_generate=True``), so only the new message is prefilled, not the document
again. The same conversation with plain ``generate()`` (the same cache reuse) gives the same text.

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

import logging
import os

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.common.chat import Chat
from hf_triforce.evaluation.common.documents import read_document
from hf_triforce.evaluation.common.smollm2 import load_smollm2

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 96
TURNS = (
    "Using only the document above: what does an assignment statement do with a target list?",
    "Give one short example of it in Python code.",
)

logger = logging.getLogger("multi_turn_chat")


def first_tokens(tokenizer, text: str, n: int) -> str:
    """The first ``n`` tokens of ``text``, as text."""
    ids = tokenizer(text[: 8 * n], add_special_tokens=False).input_ids[:n]
    return tokenizer.decode(ids)


def converse(model, tokenizer, document: str, **generate_kwargs) -> Chat:
    """Both turns of the conversation, each reusing the previous turn's cache."""
    chat = Chat(model, tokenizer, dict(max_new_tokens=NEW_TOKENS, do_sample=False, **generate_kwargs))
    chat.say(f"{document}\n\n{TURNS[0]}")
    for text in TURNS[1:]:
        chat.say(text)
    return chat


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    document = first_tokens(tokenizer, read_document(None), DOCUMENT_TOKENS)
    config = TriForceConfig(retrieval_budget=256, gamma2=6)
    logger.info("chatting about a %d-token document: TriForce, then plain generate()", DOCUMENT_TOKENS)
    fast = converse(model, tokenizer, document, triforce_config=config)
    plain = converse(model, tokenizer, document)

    for i, message in enumerate(fast.messages[1::2], start=1):
        print(f"Turn {i}:", message["content"])
    print(f"turn 2 prefilled {fast.prefilled[1]} of {fast.prompts[1]} prompt tokens "
          "(the rest came from turn 1's cache)")  # fmt: skip
    same = fast.messages == plain.messages and fast.sequences.equal(plain.sequences)
    print(f"identical to plain generate(): {same}")


if __name__ == "__main__":
    main()
