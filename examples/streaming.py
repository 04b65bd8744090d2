"""Tutorial: streaming TriForce output token by token with transformers' streamers.

TriForce calls the streamer once per verified run of tokens (plain ``generate()`` calls it once per
token), so text arrives in bursts. ``TextIteratorStreamer`` hands the text to another thread, the usual
pattern for a web server; a small subclass counts how many bursts arrived. ``--model`` takes any other supported
causal LM with a chat template (default: the embedded SmolLM2-135M-Instruct).

Run:
    .venv/bin/python examples/streaming.py                               # ~25 s on 2 CPU cores
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/streaming.py   # ~10 s

Prints (promised output): the answer as it streams, then
    streamed N tokens in K chunks (... tokens per chunk; plain generate() streams 1 per chunk)
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from pathlib import Path
from pydoc_data.topics import topics  # the Python language reference, shipped with CPython: a long offline text

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

import hf_triforce
from hf_triforce import TriForceConfig

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 128
QUESTION = "Summarize what the document says about the assert statement."
# The embedded SmolLM2-135M-Instruct: `make venv` converts it once into this directory (docs/installation.md).
EMBEDDED = Path(os.environ.get("HF_TRIFORCE_CACHE", "~/.cache/hf_triforce")).expanduser() / "smollm2-135m-instruct"

logger = logging.getLogger("streaming")


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=str(EMBEDDED), help="model directory or hub name (default: SmolLM2)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load(args.model)
    hf_triforce.enable(model)
    document = "\n\n".join(topics[key] for key in sorted(topics))
    input_ids = question_ids(tokenizer, document, QUESTION, DOCUMENT_TOKENS)
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
