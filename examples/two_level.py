"""Tutorial: two-level TriForce without any draft model (``drafter="none"``).

With ``drafter="none"`` the target drafts for itself over its retrieval-selected sparse KV cache
(level 1) and the full cache verifies (level 2): self-speculation, no second model and no n-gram
table. The example runs it next to the default three-level n-gram setup and plain ``generate()``.
``--model`` takes any other supported causal LM with a chat template (default: the embedded SmolLM2-135M-Instruct).

Run:
    .venv/bin/python examples/two_level.py                               # ~90 s on 2 CPU cores
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/two_level.py   # ~15 s

Prints (promised output): a table with one row per setup, then
    two levels (drafter='none') identical to plain generate(): True
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
DOCUMENT_TOKENS = 600 if SMALL else 4000
NEW_TOKENS = 24 if SMALL else 96
QUESTION = (  # the demo's question: the reference's first 7K tokens answer it
    "Using only the document above: what is the difference between __getattr__ and __getattribute__, and when "
    "is each of them called?"
)
BUDGET = 256 if SMALL else 512  # tokens of the KV cache level 1 reads: 1/8 of the full-size prompt
# The embedded SmolLM2-135M-Instruct: `make venv` converts it once into this directory (docs/installation.md).
EMBEDDED = Path(os.environ.get("HF_TRIFORCE_CACHE", "~/.cache/hf_triforce")).expanduser() / "smollm2-135m-instruct"
logger = logging.getLogger("two_level")


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=str(EMBEDDED), help="model directory or hub name (default: SmolLM2)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load(args.model)
    hf_triforce.enable(model)
    document = "\n\n".join(topics[key] for key in sorted(topics))
    input_ids = question_ids(tokenizer, document, QUESTION, DOCUMENT_TOKENS)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    logger.info("prompt: %d tokens; plain generate(), then drafter='none' and 'ngram'", input_ids.shape[1])
    plain, plain_speed = timed(model, input_ids, **kwargs)
    print(f"{'setup':<26}{'level-0 acc.':>13}{'level-1 acc.':>13}{'tokens/forward':>16}{'tok/s':>8}")
    print(f"{'plain generate()':<26}{'-':>13}{'-':>13}{1.0:>16.2f}{plain_speed:>8.1f}")
    outputs = {}
    for drafter in ("none", "ngram"):
        config = TriForceConfig(retrieval_budget=BUDGET, drafter=drafter)
        outputs[drafter], speed = timed(model, input_ids, triforce_config=config, **kwargs)
        stats = hf_triforce.last_stats(model)
        level0 = f"{stats.level0.acceptance_rate:.2f}" if stats.level0.drafted else "-"
        name = "two levels (none)" if drafter == "none" else "three levels (ngram)"
        print(f"{name:<26}{level0:>13}{stats.level1.acceptance_rate:>13.2f}"
              f"{stats.mean_accepted_length:>16.2f}{speed:>8.1f}")  # fmt: skip
    print("two levels (drafter='none') identical to plain generate():", torch.equal(outputs["none"], plain))
    same = torch.equal(outputs["ngram"], plain)
    print("three levels (drafter='ngram') identical to plain generate():", same)


if __name__ == "__main__":
    main()
