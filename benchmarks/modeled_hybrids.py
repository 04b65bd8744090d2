"""Where level 1 can pay on sliding-window and hybrid models: the bandwidth model's bytes per step (modeled).

For Llama-3.1-8B (every layer full), Gemma-3-12B (5 sliding layers to 1 full, window 1024), gpt-oss-20b (alternating,
window 128, 4 of 32 experts a token) and Mistral-7B-v0.1 (every layer sliding, window 4096), at 32K and 128K tokens on
an H100, bf16, a 4096-token view (``retrieval_budget=4096``): what a plain step reads (weights + each layer's attended
KV), what a level-1 step reads with the full weights and with int4 weights, and the modeled speedup of each
(:func:`hf_triforce.bench.estimate.estimate`, the acceptance measured on SmolLM2). Shapes from the models' public
config.json files (no weights). Run:
``.venv/bin/python benchmarks/modeled_hybrids.py > benchmarks/results/modeled-hybrids.md``.
"""

from __future__ import annotations

import platform

import transformers
from transformers import AutoConfig

from hf_triforce import TriForceConfig
from hf_triforce.bench.bandwidth import attended_kv_bytes
from hf_triforce.bench.estimate import estimate

SHAPES = {
    "Llama-3.1-8B": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)),
    "Gemma-3-12B": ("gemma3_text", dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
                                        num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                                        vocab_size=262208, sliding_window=1024, sliding_window_pattern=6)),
    "gpt-oss-20b": ("gpt_oss", dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                                    num_attention_heads=64, num_key_value_heads=8, head_dim=64, vocab_size=201088,
                                    sliding_window=128, num_local_experts=32, num_experts_per_tok=4)),
    "Mistral-7B-v0.1": ("mistral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                        sliding_window=4096)),
}  # fmt: skip
CONTEXTS = (32768, 131072)


def row(name: str, config, context: int) -> str:
    result = estimate(config, context=context, gpu="h100", triforce_config=TriForceConfig(retrieval_budget=4096))
    bandwidth = result.gpu.bandwidth
    weights = result.memory["weights_bytes"]
    kv = attended_kv_bytes(config, context, 2)
    plain = result.plain_floor_ms * bandwidth / 1e3
    full, int4 = result.kinds["full"], result.kinds["int4"]
    level1 = {k: v.level1_step_ms * bandwidth / 1e3 for k, v in (("full", full), ("int4", int4))}
    return (
        f"| {name} | {context // 1024}K | {weights / 1e9:.1f} | {kv / 1e9:.2f} | {kv / plain:.0%} | {plain / 1e9:.1f} "
        f"| {level1['full'] / 1e9:.1f} ({level1['full'] / plain:.0%}) | {full.speedup:.2f}x "
        f"| {level1['int4'] / 1e9:.1f} ({level1['int4'] / plain:.0%}) | {int4.speedup:.2f}x |"
    )


def main() -> None:
    print("# Modeled: bytes a decoding step reads on sliding-window and hybrid models\n")
    versions = f"transformers {transformers.__version__}, Python {platform.python_version()}"
    print(f"`benchmarks/modeled_hybrids.py`; {versions}.")
    print("Every figure is modeled (bandwidth floors at the H100's 3.35 TB/s peak, bf16, a 4096-token view,")
    print("gamma2 6), the level-1 acceptance measured on SmolLM2-135M on a CPU")
    print("(0.888 full, 0.867 int4).")
    print("A sliding layer's KV is at most its window, in a plain step and in level 1's view alike.\n")
    print(
        "| model | context | weights GB | attended KV GB | KV share of a plain step | plain step GB "
        "| level-1 step GB, full weights (of plain) | speedup, full | level-1 step GB, int4 (of plain) "
        "| speedup, int4 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (model_type, shape) in SHAPES.items():
        config = AutoConfig.for_model(model_type, **shape)
        for context in CONTEXTS:
            print(row(name, config, context))


if __name__ == "__main__":
    main()
