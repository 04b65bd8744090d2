"""The model families of the test matrix: a tiny random model of each, built from its transformers config.

Every family transformers serves through its attention interface that hf_triforce is tested on
(:data:`hf_triforce.hf.model.TESTED_MODEL_TYPES`), with what makes its attention differ from Llama's: sliding-window
or hybrid layers (windows of :data:`WINDOW` tokens, shorter than the tests' prompts), logit soft-capping, QK-norm,
partial or interleaved rotary embeddings, learned attention sinks, mixture-of-experts routing. The models are float32
and small (4 layers of width 64, 4 query / 2 KV heads), with a large ``initializer_range`` so that greedy argmaxes
are not float32 near-ties. ``python -m tests.support.families`` prints the documentation's "Supported models" table
from this registry (``docs/supported-models.md``; a unit test keeps the two equal).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
import transformers

VOCAB = 256
WINDOW = 48
"""Sliding window of the families that have one: a 200-token prompt spans four windows."""


@dataclass(frozen=True)
class Family:
    """One family of the matrix.

    Attributes:
        model_type: ``config.model_type``.
        prefix: the transformers class prefix (``{prefix}Config``, ``{prefix}ForCausalLM``).
        attention: what its attention layers are (the table's "attention" column).
        features: what else differs from Llama in its attention or MLP (the table's "features" column).
        config: config fields set on top of the shared tiny shape.
        eager: the family has no sdpa implementation in transformers (it runs ``attn_implementation="eager"``).
        config_prefix: the config class prefix where it differs from ``prefix`` (Gemma 3's text config).
    """

    model_type: str
    prefix: str
    attention: str
    features: str = ""
    config: dict = field(default_factory=dict)
    eager: bool = False
    config_prefix: str | None = None

    @property
    def sliding(self) -> bool:
        """Whether some of its layers attend through a sliding window."""
        return "sliding" in self.attention

    @property
    def all_sliding(self) -> bool:
        """Whether every layer attends through a sliding window."""
        return self.attention == "sliding window"


HYBRID = ["sliding_attention", "full_attention"] * 2
SLIDING = {"sliding_window": WINDOW}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}

FAMILIES = [
    Family("llama", "Llama", "full, GQA"),
    Family("mistral", "Mistral", "sliding window", config=SLIDING),
    Family("ministral", "Ministral", "sliding window", config={**SLIDING, "layer_types": ["sliding_attention"] * 4}),
    Family(
        "mixtral",
        "Mixtral",
        "sliding window",
        "mixture of experts",
        {**SLIDING, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),  # fmt: skip
    Family(
        "qwen2",
        "Qwen2",
        "hybrid sliding / full",
        config={**SLIDING, "use_sliding_window": True, "max_window_layers": 2},
    ),  # fmt: skip
    Family(
        "qwen2_moe",
        "Qwen2Moe",
        "full, GQA",
        "mixture of experts, shared expert",
        {**MOE, "shared_expert_intermediate_size": 32},
    ),  # fmt: skip
    Family("qwen3", "Qwen3", "full, GQA", "QK-norm"),
    Family("qwen3_moe", "Qwen3Moe", "full, GQA", "QK-norm, mixture of experts", MOE),
    Family("phi3", "Phi3", "full, GQA", "fused qkv, partial rotary", {"partial_rotary_factor": 0.5}),
    Family("gemma", "Gemma", "full, GQA", "scaled embeddings"),
    # attention soft-capped at 1 (50 by default, which a tiny model's logits never reach: a batch that ignored the cap
    # passed; at 1 test_batch[gemma2] fails without it)
    Family(
        "gemma2",
        "Gemma2",
        "hybrid sliding / full",
        "logit and attention soft-capping",
        {**SLIDING, "attn_logit_softcapping": 1.0},
        eager=True,
    ),  # fmt: skip
    Family(
        "gemma3_text",
        "Gemma3",
        "hybrid sliding / full",
        "QK-norm, local and global rotary bases",
        {**SLIDING, "layer_types": HYBRID},
        config_prefix="Gemma3Text",
    ),  # fmt: skip
    Family("granite", "Granite", "full, GQA", "attention / residual / logit multipliers"),
    Family("olmo2", "Olmo2", "full, GQA", "QK-norm over all heads"),
    Family("olmo3", "Olmo3", "hybrid sliding / full", "QK-norm over all heads", {**SLIDING, "layer_types": HYBRID}),
    # logit_scale 1 (0.0625 by default): a random model's distributions would be nearly uniform
    Family("cohere", "Cohere", "full, GQA", "interleaved rotary, parallel block, logit scale", {"logit_scale": 1.0}),
    Family(
        "cohere2",
        "Cohere2",
        "hybrid sliding / full",
        "interleaved rotary, no rotary in full layers",
        {**SLIDING, "layer_types": HYBRID, "logit_scale": 1.0},
    ),
    Family("glm4", "Glm4", "full, GQA", "interleaved partial rotary", {"partial_rotary_factor": 0.5}),
    Family("starcoder2", "Starcoder2", "sliding window", "biases, LayerNorm", SLIDING),
    Family(
        "stablelm",
        "StableLm",
        "full, GQA",
        "partial rotary, QK layer norm, layers that drop their kwargs",
        {"partial_rotary_factor": 0.25, "qk_layernorm": True},
    ),  # fmt: skip
    Family("smollm3", "SmolLM3", "full, GQA", "no rotary in some layers", {"no_rope_layer_interval": 2}),
    Family("exaone4", "Exaone4", "hybrid sliding / full", "QK-norm", {**SLIDING, "layer_types": HYBRID}),
    Family("helium", "Helium", "full, GQA"),
    Family(
        "gpt_oss",
        "GptOss",
        "hybrid sliding / full",
        "learned attention sinks, mixture of experts",
        {**SLIDING, "layer_types": HYBRID, "num_local_experts": 4, "num_experts_per_tok": 2},
        eager=True,
    ),  # fmt: skip
]
BY_TYPE = {family.model_type: family for family in FAMILIES}


def build(family: Family | str, num_layers: int = 4, seed: int = 0, vocab_size: int = VOCAB) -> torch.nn.Module:
    """A tiny random causal LM of ``family`` (float32, eval mode, sdpa or eager), not TriForce-enabled.

    ``num_layers=1`` with another seed gives a draft model of the same family and vocabulary.
    """
    family = BY_TYPE[family] if isinstance(family, str) else family
    config_cls = getattr(transformers, f"{family.config_prefix or family.prefix}Config")
    extra = {name: value[:num_layers] if name == "layer_types" else value for name, value in family.config.items()}
    config = config_cls(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        initializer_range=0.15, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        **extra,
    )  # fmt: skip
    config._attn_implementation = "eager" if family.eager else "sdpa"
    torch.manual_seed(seed)
    model = getattr(transformers, f"{family.prefix}ForCausalLM")(config).to(torch.float32).eval()
    with torch.no_grad():  # learned sinks as large as the keys' logits: an attention that ignores them changes tokens
        for module in model.modules():
            if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
                module.sinks.normal_(0.0, 3.0)
    return model


TESTED_PATHS = "greedy (n-gram, draft model), a batch, a reused cache"
"""What the matrix runs for every family (tests/integration/test_families.py)."""
SAMPLED = ("mistral", "gemma2", "gpt_oss", "qwen3_moe", "cohere2")
"""Families whose sampled output tests/integration/test_families.py tests for its distribution, one per attention kind
beyond Llama's full-attention GQA (which test_sampling_distribution.py tests in depth): sliding window in every layer
(its views retrieving inside the window), soft-capped hybrid, hybrid with learned sinks and experts, mixture of
experts with QK-norm, interleaved rotary."""


def markdown_table() -> str:
    """The "Supported models" table of the docs, one row per family of the matrix."""
    rows = [
        "| family (`model_type`) | attention | what else differs from Llama | tested | weights |",
        "|---|---|---|---|---|",
    ]
    for family in FAMILIES:
        sampled = family.model_type in SAMPLED or family.model_type == "llama"  # Llama: test_sampling_distribution
        tested = TESTED_PATHS + (", sampling (chi-square)" if sampled else "")
        weights = "real (SmolLM2-135M) and tiny random" if family.model_type == "llama" else "tiny random only"
        rows.append(f"| {family.prefix} (`{family.model_type}`) | {family.attention} | {family.features or '-'} "
                    f"| {tested} | {weights} |")  # fmt: skip
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
