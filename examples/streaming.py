"""Tutorial: streaming TriForce output token by token with transformers' streamers.

TriForce calls the streamer once per verified run of tokens (plain ``generate()`` calls it once per
token), so text arrives in bursts. ``TextIteratorStreamer`` hands the text to another thread, the usual
pattern for a web server; a small subclass counts how many bursts arrived.

Run:
    .venv/bin/python examples/streaming.py                               # ~25 s on 2 CPU cores
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/streaming.py   # ~10 s

Prints (promised output): the answer as it streams, then
    streamed N tokens in K chunks (... tokens per chunk; plain generate() streams 1 per chunk)
"""

from __future__ import annotations

import logging
import os
import threading

import torch
from transformers import TextIteratorStreamer

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.common.documents import question_prompt, read_document
from hf_triforce.evaluation.common.smollm2 import load_smollm2

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 128
QUESTION = "Summarize what the document says about the assert statement."

logger = logging.getLogger("streaming")


class CountingStreamer(TextIteratorStreamer):
    """A ``TextIteratorStreamer`` that also counts the token chunks ``generate()`` puts into it."""

    def __init__(self, tokenizer, **kwargs) -> None:
        super().__init__(tokenizer, **kwargs)
        self.chunks: list[int] = []  # tokens per put(), the prompt excluded
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.chunks.append(int(value.numel()))
        self._prompt_seen = True
        super().put(value)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    input_ids = question_prompt(tokenizer, read_document(None), QUESTION, DOCUMENT_TOKENS)
    logger.info("prompt: %d tokens; streaming from a generate() thread", input_ids.shape[1])
    streamer = CountingStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=300)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, streamer=streamer,
                  triforce_config=TriForceConfig(retrieval_budget=256))  # fmt: skip

    def generate() -> None:
        with torch.inference_mode():
            model.generate(input_ids, **kwargs)

    thread = threading.Thread(target=generate)
    thread.start()
    for text in streamer:  # blocks until the next piece of text is ready
        print(text, end="", flush=True)
    thread.join()
    print()
    tokens, chunks = sum(streamer.chunks), len(streamer.chunks)
    print(
        f"streamed {tokens} tokens in {chunks} chunks ({tokens / chunks:.1f} tokens per chunk; "
        "plain generate() streams 1 per chunk)"
    )


if __name__ == "__main__":
    main()
