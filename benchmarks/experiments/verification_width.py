"""What does a full-cache verification cost per verified token on this CPU? (groundwork for issue 53, token trees)

A token tree pays where verifying ``n`` tokens in one forward costs little more than verifying one: Sequoia's
premise on a GPU at long context. This times TriForce's own verification forward (transformers' forward over the
:class:`~hf_triforce.caches.retrieval.RetrievalCache`, inside :func:`~hf_triforce.hf.attention.capturing_queries`,
``logits_to_keep = n``) of ``n`` new tokens after a prefilled prompt, for each width, cropping the cache back after
each forward; widths interleaved, the median of ``--repeats`` forwards each. SmolLM2-135M-Instruct, float32, 2
threads, random token ids (the cost does not depend on them).

Decided: see ``results/verification-width.md`` (the table, and what it says about trees on this CPU).

    .venv/bin/python benchmarks/experiments/verification_width.py --tokens 7000 \
        > benchmarks/experiments/results/verification-width.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf_triforce.caches.retrieval import RetrievalCache  # noqa: E402
from hf_triforce.evaluation.common.loading import load_model  # noqa: E402
from hf_triforce.hf.attention import QueryCapture, capturing_queries  # noqa: E402
from hf_triforce.hf.versions import cache_kwargs  # noqa: E402

WIDTHS = (1, 2, 4, 8, 16, 32, 64)


def verify(model, cache: RetrievalCache, ids: torch.Tensor, start: int) -> float:
    """Seconds of one verification forward of ``ids`` ``[1, n]`` at position ``start``; the cache is cropped back."""
    n = ids.shape[1]
    positions = torch.arange(start, start + n)[None]
    begin = time.perf_counter()
    with torch.no_grad(), capturing_queries(model, QueryCapture(), n):
        model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=n, **cache_kwargs(cache))
    seconds = time.perf_counter() - begin
    cache.crop(-n)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=7000, help="prompt tokens in the cache (default 7000)")
    parser.add_argument("--repeats", type=int, default=9, help="forwards per width (default 9)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, _ = load_model(None)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.tokens + max(WIDTHS)), generator=gen)
    cache = RetrievalCache(model.config.num_hidden_layers, chunk_size=8, capacity=prompt.shape[1])
    with torch.no_grad():
        for piece in prompt[:, : args.tokens].split(1024, dim=1):
            model(input_ids=piece, use_cache=True, logits_to_keep=1, **cache_kwargs(cache))
    times = {n: [] for n in WIDTHS}
    for _ in range(args.repeats + 1):  # the first pass warms up
        for n in WIDTHS:
            times[n].append(verify(model, cache, prompt[:, args.tokens : args.tokens + n], args.tokens))
    one = statistics.median(times[1][1:])
    print(f"SmolLM2-135M-Instruct, float32, {args.tokens}-token cache, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; median of {args.repeats} forwards per width\n")  # fmt: skip
    print("| verified tokens | ms | x one token | ms per token |")
    print("|---:|---:|---:|---:|")
    for n in WIDTHS:
        ms = 1e3 * statistics.median(times[n][1:])
        print(f"| {n} | {ms:.1f} | {ms / (1e3 * one):.2f} | {ms / n:.1f} |")


if __name__ == "__main__":
    main()
