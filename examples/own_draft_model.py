"""Tutorial: three levels with your own small draft model (``assistant_model``).

Pass a small causal LM that shares the target's tokenizer as ``assistant_model``: it becomes level 0,
drafting ``gamma1`` tokens at a time over a StreamingLLM cache of ``draft_cache_budget`` tokens
(attention sinks + a recent window), whatever the context length. Level 1 verifies its drafts exactly.

The embedded SmolLM2-135M-Instruct is the only model ``make venv`` provides, so by default a second copy of it
stands in for the draft model (acceptance then shows what a StreamingLLM cache keeps; it is not faster on this
tiny target, so the example runs it with the fixed schedule, ``adaptive=False``, where level 0 drafts every step).
Pass ``--draft DIR`` to use a real one, e.g. SmolLM2-135M as the draft of SmolLM2-1.7B given with ``--target DIR``
(a pair that shares a tokenizer, not measured by this project).

Run:
    .venv/bin/python examples/own_draft_model.py                                # ~50 s on 2 CPU cores
    .venv/bin/python examples/own_draft_model.py --target ./smollm2-1.7b --draft ./smollm2-135m
    HF_TRIFORCE_EXAMPLE_SMALL=1 .venv/bin/python examples/own_draft_model.py    # ~15 s

Prints (promised output):
    level-0 (draft model) acceptance: ...
    identical to plain generate(): True
    a draft model with another vocabulary is refused: ...
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from pydoc_data.topics import topics  # the Python language reference, shipped with CPython: a long offline text

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import hf_triforce
from hf_triforce import TriForceConfig, UnsupportedModelError

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 96
QUESTION = "Using only the document above: when is an AssertionError raised?"
# The embedded SmolLM2-135M-Instruct: `make venv` converts it once into this directory (docs/installation.md).
EMBEDDED = Path(os.environ.get("HF_TRIFORCE_CACHE", "~/.cache/hf_triforce")).expanduser() / "smollm2-135m-instruct"

logger = logging.getLogger("own_draft_model")


def load(path: str):
    """The model (float32, eval mode) and its tokenizer, from a ``save_pretrained`` directory or a hub name."""
    if path == str(EMBEDDED) and not EMBEDDED.is_dir():
        raise SystemExit(f"no model in {EMBEDDED}: `make venv` converts the embedded SmolLM2 there; or pass --target")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def question_ids(tokenizer, document: str, question: str, tokens: int) -> torch.Tensor:
    """``[1, n]`` chat-template token ids asking ``question`` about the first ``tokens`` tokens of ``document``."""
    cut = tokenizer.decode(tokenizer(document[: 8 * tokens], add_special_tokens=False).input_ids[:tokens])
    messages = [{"role": "user", "content": f"{cut}\n\nQuestion: {question}"}]
    chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return chat["input_ids"]


def mismatched_draft(vocab_size: int) -> LlamaForCausalLM:
    """A tiny random Llama whose vocabulary differs from the target's (to show the check)."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--target", default=str(EMBEDDED), help="target model directory (default: SmolLM2)")
    parser.add_argument("--draft", default=None, help="draft model directory sharing the target's tokenizer")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    model, tokenizer = load(args.target)
    draft, _ = load(args.draft or str(EMBEDDED))  # default: a second SmolLM2-135M stands in for a small draft
    hf_triforce.enable(model)  # the target only; the draft model is used as-is
    document = "\n\n".join(topics[key] for key in sorted(topics))
    input_ids = question_ids(tokenizer, document, QUESTION, DOCUMENT_TOKENS)
    logger.info("prompt: %d tokens; draft model: %s", input_ids.shape[1], args.draft or "SmolLM2-135M (stand-in)")
    # The stand-in costs what the target costs, so the adaptive schedule may rightly leave it idle (it drafts only
    # where its step times pay); the fixed level 0 -> 1 -> 2 schedule shows what it drafts. A real draft: adaptive.
    adaptive = args.draft is not None
    config = TriForceConfig(retrieval_budget=256, drafter="model", gamma1=2, draft_cache_budget=256, adaptive=adaptive)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.inference_mode():
        fast = model.generate(input_ids, triforce_config=config, assistant_model=draft, **kwargs)
        stats = hf_triforce.last_stats(model)
        plain = model.generate(input_ids, **kwargs)

    print("Answer:", tokenizer.decode(fast[0, input_ids.shape[1] :], skip_special_tokens=True).strip())
    print(f"level-0 (draft model) acceptance: {stats.level0.acceptance_rate:.2f} "
          f"({stats.level0.accepted}/{stats.level0.drafted} drafted tokens)")  # fmt: skip
    print(f"level-1 (retrieval) acceptance: {stats.level1.acceptance_rate:.2f}")
    print(f"draft cache: {stats.draft_cache_bytes / 2**20:.1f} MiB (StreamingLLM, {config.draft_cache_budget} tokens)")
    print("identical to plain generate():", torch.equal(fast, plain))

    wrong = mismatched_draft(vocab_size=256)
    try:
        model.generate(input_ids, triforce_config=config, assistant_model=wrong, **kwargs)
    except UnsupportedModelError as err:  # raised before any forward
        print("a draft model with another vocabulary is refused:", str(err).split(":", 1)[0])


if __name__ == "__main__":
    main()
