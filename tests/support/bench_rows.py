"""A bench result row (``hf-triforce bench``'s JSON) built from a few timings, for the tests of what reads them."""

from __future__ import annotations


def bench_row(
    name: str, temperature: float, plain_s: float, static_s: float, triforce_s: float, looping: bool = False
) -> dict:
    """One prompt's row: seconds per token of plain ``generate()`` (dynamic), the static cache and TriForce."""
    plain = {"decode_seconds_per_token": plain_s, "tokens_per_second": 1 / plain_s}
    static = {"decode_seconds_per_token": static_s, "tokens_per_second": 1 / static_s}
    best = "static" if static_s < plain_s else "dynamic"
    return {
        "prompt": {"name": name}, "prompt_tokens": 7000, "temperature": temperature, "budget": 512,
        "drafter": "ngram", "plain": plain, "triforce": {"decode_seconds_per_token": triforce_s,
        "tokens_per_second": 1 / triforce_s}, "speedup": plain_s / triforce_s, "identical_output": True,
        "plain_decodings": {"dynamic": plain, "static": static, "flash_attention_2": {"error": "not run: CUDA only"}},
        "best_plain": best, "speedup_best_plain": min(plain_s, static_s) / triforce_s, "loops": looping,
        "answer_repeated_fraction": 0.6 if looping else 0.0, "weight_bytes": 1000, "kv_bytes_per_token": 10,
    }  # fmt: skip
