"""Model shapes: random-weights presets for speed benchmarks (acceptance is meaningless with random weights).

Example:
    >>> preset_config("llama3.1-8b", context=131072).num_key_value_heads
    8
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_triforce.errors import TriForceConfigError

# Llama-architecture shapes of the models the paper and the design discuss.
PRESETS: dict[str, dict] = {
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, rope_theta=10000.0),
    "llama3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    # The paper's level-0 drafter (JackFram/llama-68m); use it as --draft-preset.
    "draft-68m": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=12,
                      num_key_value_heads=12, vocab_size=32000, rope_theta=10000.0),
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True),
    # For tests of the harness itself.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, rope_theta=10000.0),
}  # fmt: skip


def preset_config(name: str, context: int, attn_implementation: str = "sdpa") -> LlamaConfig:
    """The ``LlamaConfig`` of preset ``name`` with room for ``context`` positions.

    Raises:
        ValueError: unknown preset (the message lists the known ones).
    """
    if name not in PRESETS:
        raise TriForceConfigError(f"unknown shape preset {name!r}: choose one of {sorted(PRESETS)}.")
    shape = {"tie_word_embeddings": False, **PRESETS[name]}
    return LlamaConfig(max_position_embeddings=context, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       initializer_range=0.02, attn_implementation=attn_implementation, **shape)  # fmt: skip


def random_model(
    name: str, context: int, dtype: torch.dtype, device: str | torch.device, seed: int = 0, attn_implementation="sdpa"
):
    """A ``LlamaForCausalLM`` of preset ``name`` with seeded random weights, in eval mode on ``device``.

    The weights are created directly in ``dtype`` on ``device`` (a 7B/8B shape does not fit in float32
    on most hosts).

    Example:
        >>> model = random_model("tiny", context=512, dtype=torch.float32, device="cpu")
        >>> model.config.num_hidden_layers
        2
    """
    config = preset_config(name, context, attn_implementation)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()
