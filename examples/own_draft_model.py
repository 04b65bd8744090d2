"""Tutorial: three levels with your own small draft model (``assistant_model``).

Pass a small causal LM that shares the target's tokenizer as ``assistant_model``: it becomes level 0,
drafting ``gamma1`` tokens at a time over a StreamingLLM cache of ``draft_cache_budget`` tokens
(attention sinks + a recent window), whatever the context length. Level 1 verifies its drafts exactly.

No smaller model with SmolLM2's vocabulary can be downloaded here, so by default a second copy of
SmolLM2-135M-Instruct stands in for the draft model (acceptance then shows what a StreamingLLM cache
keeps; it is not faster on this tiny target). Pass ``--draft DIR`` to use a real one, e.g. SmolLM2-135M
as the draft of SmolLM2-1.7B given with ``--target DIR``.

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

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import hf_triforce
from hf_triforce import TriForceConfig, UnsupportedModelError
from hf_triforce.evaluation.common.documents import question_prompt, read_document
from hf_triforce.evaluation.common.smollm2 import load_smollm2

SMALL = os.environ.get("HF_TRIFORCE_EXAMPLE_SMALL") == "1"
DOCUMENT_TOKENS = 600 if SMALL else 3000
NEW_TOKENS = 24 if SMALL else 96
QUESTION = "Using only the document above: when is an AssertionError raised?"

logger = logging.getLogger("own_draft_model")


def load(path: str | None):
    """``(model, tokenizer)`` from a local ``save_pretrained`` directory, or the embedded SmolLM2."""
    if path is None:
        return load_smollm2()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval(), AutoTokenizer.from_pretrained(path)


def mismatched_draft(vocab_size: int) -> LlamaForCausalLM:
    """A tiny random Llama whose vocabulary differs from the target's (to show the check)."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--target", default=None, help="target model directory (default: embedded SmolLM2)")
    parser.add_argument("--draft", default=None, help="draft model directory sharing the target's tokenizer")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    model, tokenizer = load(args.target)
    draft, _ = load(args.draft)  # default: a second SmolLM2-135M instance stands in for a small draft model
    hf_triforce.enable(model)  # the target only; the draft model is used as-is
    input_ids = question_prompt(tokenizer, read_document(None), QUESTION, DOCUMENT_TOKENS)
    logger.info("prompt: %d tokens; draft model: %s", input_ids.shape[1], args.draft or "SmolLM2-135M (stand-in)")
    config = TriForceConfig(retrieval_budget=256, drafter="model", gamma1=2, draft_cache_budget=256, draft_sinks=16)
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
