"""Tutorial: several questions about one long document, the document prefilled once into a cache.

The transformers pattern for a shared prefix: prefill it into a ``DynamicCache`` once, ``copy.deepcopy`` it
per question and pass the copy as the cache; only each question's own tokens are prefilled. TriForce takes
the same cache. Timed three ways in one process, end to end: plain ``generate()`` without reuse, plain
``generate()`` with reuse, TriForce with reuse (the reuse totals include the one shared prefill). ``--model`` takes
any other supported causal LM with a chat template (default: the embedded SmolLM2-135M-Instruct).

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
import copy
import logging
import os
import time
from pathlib import Path
from pydoc_data.topics import topics  # the Python language reference, shipped with CPython: a long offline text

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import hf_triforce
from hf_triforce import TriForceConfig

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
QUESTIONS = (  # the reference's first 7K tokens answer each of them
    "Using only the document above: what is the difference between __getattr__ and __getattribute__, and when "
    "is each of them called?",
    "Using only the document above: what do the 'async with' and 'async for' statements do?",
    "Using only the document above: what does the assert statement do, and what happens to assertions when "
    "Python runs with optimization (-O)?",
    "Using only the document above: how is an assignment to a target list with a starred target carried out?",
)
# transformers 5.24 renamed generate()'s and forward()'s cache argument past_key_values to cache.
CACHE = "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"
# The embedded SmolLM2-135M-Instruct: `make venv` converts it once into this directory (docs/installation.md).
EMBEDDED = Path(os.environ.get("HF_TRIFORCE_CACHE", "~/.cache/hf_triforce")).expanduser() / "smollm2-135m-instruct"

logger = logging.getLogger("several_questions")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=str(EMBEDDED), help="model directory or hub name (default: SmolLM2)")
    parser.add_argument("--document", default=None, help="UTF-8 text file (default: the Python reference)")
    parser.add_argument("--tokens", type=int, default=1000 if SMALL else 7000, help="document tokens to keep")
    parser.add_argument("--questions", type=int, default=2 if SMALL else 4, help="how many questions to ask")
    parser.add_argument("--new-tokens", type=int, default=24 if SMALL else 128)
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


def shared_prefix(prompts: list[torch.Tensor]) -> int:
    """Tokens every ``[1, n]`` prompt starts with (the chat template's opening and the document), at most the
    shortest prompt minus one: each call must have a token of its own to prefill."""
    n = min(p.shape[1] for p in prompts) - 1
    for p in prompts[1:]:
        differs = (p[0, :n] != prompts[0][0, :n]).nonzero()
        n = int(differs[0]) if len(differs) else n
    return n


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load(args.model)
    hf_triforce.enable(model)
    if args.document is None:
        document = "\n\n".join(topics[key] for key in sorted(topics))
    else:
        document = Path(args.document).read_text(encoding="utf-8")
    questions = QUESTIONS[: args.questions]
    room = model.config.max_position_embeddings - args.new_tokens - 64  # prompt + answer must fit the context
    prompts = [question_ids(tokenizer, document, q, min(args.tokens, room)) for q in questions]
    n = shared_prefix(prompts)
    logger.info("%d questions about a %d-token document; %d tokens shared", len(prompts), prompts[0].shape[1], n)

    start = time.perf_counter()  # the shared prefix, prefilled once
    prefix = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=prompts[0][:, :n], use_cache=True, **{CACHE: prefix})
    prefill_seconds = time.perf_counter() - start

    kwargs = dict(max_new_tokens=args.new_tokens, do_sample=False)
    config = TriForceConfig(retrieval_budget=256 if SMALL else 512)
    ways = {"plain": {}, "plain_reuse": {}, "triforce_reuse": {"triforce_config": config}}
    answers = {way: [] for way in ways}  # way -> [(sequences, seconds)] per question
    for way, extra in ways.items():
        for ids in prompts:
            start = time.perf_counter()
            reuse = {CACHE: copy.deepcopy(prefix)} if way.endswith("_reuse") else {}  # the copy is part of the cost
            with torch.inference_mode():
                out = model.generate(ids, **reuse, **kwargs, **extra)
            answers[way].append((out, time.perf_counter() - start))

    for i, (question, ids) in enumerate(zip(questions, prompts, strict=True), start=1):
        answer = answers["triforce_reuse"][i - 1][0][0, ids.shape[1] :]
        print(f"Q{i}: {question}\nA{i}: {tokenizer.decode(answer, skip_special_tokens=True).strip()}")
    same = all(
        torch.equal(plain, other)
        for way in ("plain_reuse", "triforce_reuse")
        for (plain, _), (other, _) in zip(answers["plain"], answers[way], strict=True)
    )
    print(f"identical text: {'yes' if same else 'NO'}")
    total = {way: sum(s for _, s in runs) + (prefill_seconds if way.endswith("_reuse") else 0.0)
             for way, runs in answers.items()}  # fmt: skip
    print(f"end to end: plain {total['plain']:.1f} s, plain + reuse {total['plain_reuse']:.1f} s, "
          f"TriForce + reuse {total['triforce_reuse']:.1f} s")  # fmt: skip
    print(f"TriForce + reuse: {total['plain_reuse'] / total['triforce_reuse']:.2f}x plain + reuse, "
          f"{total['plain'] / total['triforce_reuse']:.2f}x plain without reuse")  # fmt: skip


if __name__ == "__main__":
    main()
