"""Tutorial: question answering over a long document, TriForce against plain ``generate()``.

Cuts the Python language reference to ~7K tokens, asks a question whose answer sits in the middle of
it, and measures plain ``generate()`` and TriForce in the same process on the same prompt: decode speed with the
prefill excluded (a streamer notes when the first new token arrives), after a short warm-up of each.
``--model`` takes any other supported causal LM with a chat template (default: the embedded SmolLM2-135M-Instruct).

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
import time
from pathlib import Path
from pydoc_data.topics import topics  # the Python language reference, shipped with CPython: a long offline text

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation import BaseStreamer

import hf_triforce
from hf_triforce import TriForceConfig

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
QUESTION = "Using only the document above: what do the 'async with' and 'async for' statements do?"
# The embedded SmolLM2-135M-Instruct: `make venv` converts it once into this directory (docs/installation.md).
EMBEDDED = Path(os.environ.get("HF_TRIFORCE_CACHE", "~/.cache/hf_triforce")).expanduser() / "smollm2-135m-instruct"

logger = logging.getLogger("long_document_qa")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=str(EMBEDDED), help="model directory or hub name (default: SmolLM2)")
    parser.add_argument("--document", default=None, help="UTF-8 text file (default: the Python reference)")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--tokens", type=int, default=1000 if SMALL else 7000, help="document tokens to keep")
    parser.add_argument("--new-tokens", type=int, default=24 if SMALL else 128)
    parser.add_argument("--budget", type=int, default=256 if SMALL else 512, help="retrieval_budget")
    return parser.parse_args()


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


class DecodeClock(BaseStreamer):
    """Times decoding with the prefill excluded: ``generate()`` puts the prompt, then the prefill's token, then the
    decoded tokens (one at a time for plain decoding, a verified run at a time for TriForce)."""

    def __init__(self) -> None:
        self.puts: list[tuple[float, int]] = []  # (time, tokens) of each put() after the prompt's
        self.prompt_seen = False
        self.finished = 0.0

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:
            self.puts.append((time.perf_counter(), value.numel()))
        self.prompt_seen = True

    def end(self) -> None:
        self.finished = time.perf_counter()

    @property
    def tokens_per_second(self) -> float:
        """Tokens after the first over the time from the first to the end."""
        return (sum(n for _, n in self.puts) - 1) / (self.finished - self.puts[0][0])


def timed(model, input_ids: torch.Tensor, **kwargs) -> tuple[torch.Tensor, float]:
    """``generate()``'s sequences and its decode speed (tokens/s, the prefill excluded)."""
    clock = DecodeClock()
    with torch.inference_mode():
        sequences = model.generate(input_ids, streamer=clock, **kwargs)
    return sequences, clock.tokens_per_second


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load(args.model)
    hf_triforce.enable(model)
    if args.document is None:
        document = "\n\n".join(topics[key] for key in sorted(topics))
    else:
        document = Path(args.document).read_text(encoding="utf-8")
    room = model.config.max_position_embeddings - args.new_tokens - 64  # prompt + answer must fit the context
    ids = question_ids(tokenizer, document, args.question, min(args.tokens, room))
    config = TriForceConfig(retrieval_budget=args.budget)
    kwargs = dict(max_new_tokens=args.new_tokens, do_sample=False)

    logger.info("prompt: %d tokens; a warm-up of each, then plain generate(), then TriForce", ids.shape[1])
    timed(model, ids, **{**kwargs, "max_new_tokens": 8})  # one-time allocations at this cache size
    timed(model, ids, triforce_config=config, **{**kwargs, "max_new_tokens": 8})
    plain, plain_speed = timed(model, ids, **kwargs)
    fast, fast_speed = timed(model, ids, triforce_config=config, **kwargs)
    stats = hf_triforce.last_stats(model)

    answer = tokenizer.decode(fast[0, ids.shape[1] :], skip_special_tokens=True)
    print("Answer:", answer.strip())
    print(f"prompt: {ids.shape[1]} tokens, retrieval budget: {args.budget} tokens")
    print(
        f"decode speed: plain {plain_speed:.1f} tok/s, "
        f"TriForce {fast_speed:.1f} tok/s, speedup {fast_speed / plain_speed:.2f}x"
    )
    print(f"level-1 (retrieval) acceptance: {stats.level1.acceptance_rate:.2f}")
    print(f"tokens per full-cache forward: {stats.mean_accepted_length:.2f}")
    print("identical text:", "yes" if torch.equal(fast, plain) else "NO")


if __name__ == "__main__":
    main()
