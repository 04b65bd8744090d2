"""Level 1's forward run directly over a Llama-family decoder's weights as plain torch calls: on the CPU transformers'
module calls, mask and dispatch add much to a few-token step, and level 1 only drafts (the output is unchanged)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import Cache

from ..errors import UnsupportedModelError
from ..kernels.attention import gqa_sdpa_attention, packed_causal_bias
from ..kernels.int4_linear import Int4Weight, int4_kernel_supports, quantize_int4
from ..kernels.int8_linear import MAX_ROWS, Int8Weight, int8_kernel_supports, quantize_int8
from ..kernels.linear import linear_forward
from ..kernels.verify_cpu import verify_attention_cpu
from .attention import active_tree_mask
from .distributed import tensor_parallel_size
from .linears import kept_beside, weight_fingerprint
from .model import decoder_layers, is_dispatched, rope_matrices
from .quantization import is_plain_linear, quantized_linears
from .versions import cache_layer_types

DIRECT_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")
"""``config.model_type`` values whose decoder layers :class:`DirectDecoder` runs."""

RANGES_FROM_KEYS = 3072
"""Keys from which a few-token step's attention runs its keys as ranges: three tokens' packed rows over SmolLM2's 3 KV
heads, 30 layers, the keys out of the caches, 2 threads: 1.00x one call's time at 1024-2048 keys, 0.93x at 3072,
0.85x at 4096 (below, the ranges' merge costs what the idle thread would)."""

_DECODERS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, DirectDecoder]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Projection:
    """``nn.Linear`` layers on one input, outputs concatenated (``[..., K]`` -> ``[..., sum N]``), or their stacked
    low-bit copy for a few rows."""

    layers: tuple[torch.nn.Linear, ...]
    low_bit: Int8Weight | Int4Weight | None = None
    bias: torch.Tensor | None = None

    @classmethod
    def of(cls, *layers: torch.nn.Linear, weights: str = "full") -> Projection:
        """The projection of ``layers``, with a stacked ``"int8"``/``"int4"`` copy where a kernel serves the shape."""
        weight = torch.cat([layer.weight.detach() for layer in layers]) if weights != "full" else None
        if weight is None or not int8_kernel_supports(weight):
            return cls(tuple(layers))
        bias = None  # one bias for the fused projection where any part has one (zeros for the others)
        if any(layer.bias is not None for layer in layers):
            bias = torch.cat([_bias_or_zeros(layer) for layer in layers])
        if weights == "int4" and int4_kernel_supports(weight):
            return cls(tuple(layers), quantize_int4(weight), bias)
        return cls(tuple(layers), quantize_int8(weight), bias)

    def in_dtype(self, rows: int) -> torch.dtype:
        """The dtype ``rows`` rows are multiplied in: bfloat16 where the low-bit copy serves them (its kernels round
        their input to it), else the layers' own."""
        return torch.bfloat16 if self._low_bit_serves(rows) else self.layers[0].weight.dtype

    def _low_bit_serves(self, rows: int) -> bool:
        """Whether ``rows`` rows multiply by the low-bit copy (past :data:`MAX_ROWS` its kernel is no faster)."""
        return self.low_bit is not None and rows <= MAX_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[rows, K]`` times the weights, ``[rows, sum N]``: in bfloat16 from the low-bit copy (a caller that
        keeps it so saves two casts a product; with a bias, in the bias' dtype), else in the layers' dtype (``x``
        cast to it)."""
        if self._low_bit_serves(x.shape[0]):
            out = self.low_bit.rows_product(x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16))
            return out if self.bias is None else out + self.bias
        x = x.to(self.layers[0].weight.dtype)
        outputs = [linear_forward(layer, x) for layer in self.layers]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)


def _bias_or_zeros(layer: torch.nn.Linear) -> torch.Tensor:
    return layer.weight.new_zeros(layer.weight.shape[0]) if layer.bias is None else layer.bias.detach()


@dataclass(frozen=True)
class Norm:
    """Llama's RMSNorm over the last dimension, ``x * rsqrt(mean(x^2) + eps) * weight``, as few operations as it
    takes: for a float32 ``x`` ``[q, H]``, ``x / hypot(|x|, sqrt(H * eps)) * (weight * sqrt(H))`` (the same
    arithmetic: ``|x|^2 + H * eps = H * (mean(x^2) + eps)``), written in the dtype the next product takes. On the CPU
    ``F.rms_norm`` runs six operations and a cast after it one more (~31 us a call in a level-1 step); this runs
    four and writes the cast result directly.

    Example:
        >>> norm = Norm.of(torch.nn.RMSNorm(2, eps=0.0, elementwise_affine=True))
        >>> norm(torch.tensor([[2.0, -2.0]]), torch.bfloat16).tolist()
        [[1.0, -1.0]]
    """

    weight: torch.Tensor
    eps: float
    scaled: torch.Tensor  # float32 weight * sqrt(H)
    floor: torch.Tensor  # float32 sqrt(H * eps), 0-dim

    @classmethod
    def of(cls, module: torch.nn.Module | None) -> Norm | None:
        """The norm of an RMSNorm ``module`` (its ``weight`` and ``variance_epsilon`` or ``eps``); ``None`` for none."""
        if module is None:
            return None
        weight = module.weight.detach()
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        eps = 1e-6 if eps is None else float(eps)
        size = weight.shape[-1]
        floor = torch.tensor((size * eps) ** 0.5, dtype=torch.float32, device=weight.device)
        return cls(weight, eps, weight.float() * size**0.5, floor)

    def __call__(self, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``x`` ``[..., H]`` normalized, in ``dtype`` (default: as Llama's RMSNorm returns it)."""
        if x.dtype != torch.float32:  # as Llama's RMSNorm: float32 arithmetic, cast back, then the weight
            variance = x.float().pow(2).mean(-1, keepdim=True)
            out = self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)
            return out if dtype is None else out.to(dtype)
        unit = x / torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True), self.floor)
        if dtype in (None, torch.float32):
            return unit.mul_(self.scaled)
        return torch.mul(unit, self.scaled, out=torch.empty(x.shape, dtype=dtype, device=x.device))


def _function(act: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """An activation module's ``forward`` (what calling it runs, without ``nn.Module.__call__``'s hook handling,
    ~5 us a call), or ``act`` itself where it is a function."""
    return act.forward if isinstance(act, torch.nn.Module) else act


@dataclass(frozen=True)
class DirectLayer:
    """One decoder layer's weights as :class:`DirectDecoder` runs them."""

    input_norm: Norm
    qkv: Projection
    q_norm: Norm | None
    k_norm: Norm | None
    o: Projection
    post_norm: Norm
    gate_up: Projection
    down: Projection
    act: Callable[[torch.Tensor], torch.Tensor]
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float

    @classmethod
    def from_module(cls, layer: torch.nn.Module, heads: int, kv_heads: int, weights: str) -> DirectLayer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = (attn.qkv_proj,) if hasattr(attn, "qkv_proj") else (attn.q_proj, attn.k_proj, attn.v_proj)
        gate_up = (mlp.gate_up_proj,) if hasattr(mlp, "gate_up_proj") else (mlp.gate_proj, mlp.up_proj)
        return cls(
            Norm.of(layer.input_layernorm), Projection.of(*qkv, weights=weights),
            Norm.of(getattr(attn, "q_norm", None)), Norm.of(getattr(attn, "k_norm", None)),
            Projection.of(attn.o_proj, weights=weights),
            Norm.of(layer.post_attention_layernorm), Projection.of(*gate_up, weights=weights),
            Projection.of(mlp.down_proj, weights=weights), _function(getattr(mlp, "act_fn", None) or mlp.activation_fn),
            heads, kv_heads, attn.head_dim, float(attn.scaling),
        )  # fmt: skip

    def __call__(self, x: torch.Tensor, rope: torch.Tensor, cache_layer, attend) -> torch.Tensor:
        """``x`` ``[q, H]`` after this layer (added to in place); the new keys/values are appended to ``cache_layer``.
        ``rope``: :func:`~hf_triforce.hf.model.rope_matrices` ``[q, D, D]``; ``attend``: the step's
        :class:`_StepAttention`. With a low-bit copy the products' outputs and the MLP's activation stay in bfloat16
        (the next product rounds its input to it anyway) and are added to the float residual in place: four casts
        and a copy fewer a layer than casting each product's input and output."""
        q = x.shape[0]
        x += self.o(self.attention(self.input_norm(x, self.qkv.in_dtype(q)), rope, cache_layer, attend))
        gate, up = self.gate_up(self.post_norm(x, self.gate_up.in_dtype(q))).chunk(2, dim=-1)
        return x.add_(self.down(self.act(gate).mul_(up)))

    def attention(self, h: torch.Tensor, rope: torch.Tensor, cache_layer, attend) -> torch.Tensor:
        """Self-attention of ``h`` ``[q, H]`` over the cache layer and itself (causal): ``[q, heads * head_dim]``, in
        the dtype the output projection multiplies it in."""
        q, d, heads = h.shape[0], self.head_dim, self.heads
        states = self.qkv(h).to(rope.dtype).view(q, heads + 2 * self.kv_heads, d)
        if self.q_norm is None and self.k_norm is None:  # queries and keys rotated in one product
            rotated = torch.bmm(states[:, : heads + self.kv_heads], rope)
            query, key = rotated[:, :heads], rotated[:, heads:]
        else:
            query = torch.bmm(self._head_norm(states[:, :heads], self.q_norm), rope)
            key = torch.bmm(self._head_norm(states[:, heads : heads + self.kv_heads], self.k_norm), rope)
        value = states[:, heads + self.kv_heads :]
        keys, values = cache_layer.update(key.transpose(0, 1)[None], value.transpose(0, 1)[None])
        out = attend(query, keys, values, self.scaling)  # [q, heads, D], heads-major in memory
        rows = torch.empty((q, heads, out.shape[-1]), dtype=self.o.in_dtype(q), device=out.device)
        return rows.copy_(out).view(q, -1)  # one copy: contiguous and cast

    @staticmethod
    def _head_norm(x: torch.Tensor, norm: Norm | None) -> torch.Tensor:
        return x if norm is None else norm(x)


class _StepAttention:
    """Attention of one step's ``q`` queries ``[q, H, D]`` over a layer's keys/values ``[1, H_kv, L, D]`` (the queries'
    own keys last): ``[q, H, D]``, causal, or a token tree's mask (:func:`~hf_triforce.hf.attention.active_tree_mask`).

    Several queries run as one SDPA call with each KV head's query group packed into ``groups * q`` rows, over an
    additive causal bias made once per key length for the whole step (not once per layer): on the CPU a few-token
    attention over a short view costs its small operations more than its arithmetic, and one fused call reads the view
    once (three tokens over a 512-token view of 7K: 21.9 -> 20.8 ms a step against a product, a softmax and a
    product per KV head). From :data:`RANGES_FROM_KEYS` keys the keys run as ranges of that one call, merged by their
    log-sum-exp, as the verification's do (:func:`~hf_triforce.kernels.verify_cpu.verify_attention_cpu`), so both
    threads have work with 3 KV heads. One query runs SDPA without a bias, as plain decoding does.
    """

    def __init__(self, q: int) -> None:
        self.q = q
        self._biases: dict[tuple[int, int], torch.Tensor] = {}

    def __call__(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float) -> torch.Tensor:
        q, heads, d = query.shape
        tree = active_tree_mask(keys.shape[2])
        if tree is not None:
            packed = query.transpose(0, 1)[None]
            return gqa_sdpa_attention(None, packed, keys, values, tree, scaling=scaling)[0][0]
        if q == 1:
            grouped = heads != keys.shape[1]
            out = F.scaled_dot_product_attention(
                query.transpose(0, 1)[None], keys, values, scale=scaling, enable_gqa=grouped
            )
            return out[0].transpose(0, 1)
        if keys.shape[2] >= RANGES_FROM_KEYS:
            ranged = verify_attention_cpu(query.transpose(0, 1)[None], keys, values, scaling)
            if ranged is not None:
                return ranged[0].transpose(0, 1)
        kv_heads = keys.shape[1]
        rows = query.transpose(0, 1).reshape(1, kv_heads, heads // kv_heads * q, d)  # [1, H_kv, groups * q, D]
        bias = self._bias(heads // kv_heads, keys)
        out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=bias, scale=scaling)
        return out.view(heads, q, -1).transpose(0, 1)  # [1, H_kv, groups * q, D_v] -> [q, H, D_v]

    def _bias(self, groups: int, keys: torch.Tensor) -> torch.Tensor:
        """``[groups * q, L]`` additive bias: packed row ``r`` (query ``r % q``) sees keys ``0 .. L - q + r % q``."""
        length = keys.shape[2]
        bias = self._biases.get((groups, length))
        if bias is None:
            bias = packed_causal_bias(groups, self.q, length, keys.dtype, keys.device)
            self._biases[groups, length] = bias
        return bias


class DirectDecoder:
    """A Llama-family causal LM's forward for a few tokens over a cache, as plain torch calls on its weights.

    Args:
        model: see :func:`direct_forward_problem`.
        weights: ``"full"``, ``"int8"`` (stacked int8 copies of the projections and LM head) or ``"int4"`` (int4
            projections; the LM head stays int8, since level 1 samples from its logits).
    """

    def __init__(self, model: torch.nn.Module, weights: str = "full") -> None:
        problem = direct_forward_problem(model)
        if problem is not None:
            raise UnsupportedModelError(f"level 1's direct forward cannot run this model: {problem}.")
        config, inner = model.config.get_text_config(), model.model
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        self.weights = weights
        self.embed, self.rotary = inner.embed_tokens, inner.rotary_emb
        self.layers = [DirectLayer.from_module(layer, heads, kv_heads, weights) for layer in inner.layers]
        self.norm = Norm.of(inner.norm)
        self.head = Projection.of(model.lm_head, weights="full" if weights == "full" else "int8")

    def logits(self, tokens: torch.Tensor, position: int | torch.Tensor, cache: Cache) -> torch.Tensor:
        """float32 logits ``[q, V]`` of ``tokens`` ``[q]`` at positions ``position ..`` (or ``[q]``, one per token),
        appended to ``cache`` (batch 1; ``layers[i].update`` returns all of the layer's keys/values)."""
        x = self.embed.weight[tokens]
        if isinstance(position, torch.Tensor):  # each token's own (a token tree's nodes share their depth's)
            positions = position.to(tokens.device)[None]
        else:
            positions = torch.arange(position, position + tokens.shape[0], device=tokens.device)[None]
        cos, sin = self.rotary(x[None], positions)
        rope, attend = rope_matrices(cos[0], sin[0], self.layers[0].head_dim), _StepAttention(tokens.shape[0])
        for layer, cache_layer in zip(self.layers, cache.layers, strict=True):
            x = layer(x, rope, cache_layer, attend)
        return self.head(self.norm(x, self.head.in_dtype(x.shape[0]))).float()


def direct_forward_problem(model: torch.nn.Module) -> str | None:
    """Why :class:`DirectDecoder` cannot run ``model`` (``None``: it can)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return "it is not a transformers causal LM with a config"
    model_type = getattr(config.get_text_config(), "model_type", None)
    if model_type not in DIRECT_MODEL_TYPES:
        return f"model_type={model_type!r} (served: {', '.join(DIRECT_MODEL_TYPES)})"
    if is_dispatched(model) or tensor_parallel_size(model) > 1:
        return "the model is dispatched by accelerate or sharded across tensor-parallel ranks"
    if "sliding_attention" in cache_layer_types(config.get_text_config(decoder=True)):
        return "it has sliding-window layers, and this forward attends to the whole view in every layer"
    layers, inner = decoder_layers(model), getattr(model, "model", None)
    parts = ("embed_tokens", "rotary_emb", "norm")
    if layers is None or not all(hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head"):
        return "it lacks the Llama layout (model.embed_tokens, layers, norm, rotary_emb; lm_head)"
    quantized = quantized_linears(model)
    if quantized is not None:
        return f"{quantized}, not plain nn.Linear (it multiplies by float weights itself)"
    linears = [model.lm_head] + [m for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    embed = getattr(inner.embed_tokens, "weight", None)
    if not all(is_plain_linear(m) for m in linears) or type(embed) not in (torch.nn.Parameter, torch.Tensor):
        return "some of its linear layers are quantized or wrapped (not plain nn.Linear)"
    attn, mlp = layers[0].self_attn, layers[0].mlp
    has_qkv = hasattr(attn, "qkv_proj") or all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj"))
    has_mlp = hasattr(mlp, "gate_up_proj") or all(hasattr(mlp, p) for p in ("gate_proj", "up_proj"))
    if not (has_qkv and has_mlp and hasattr(attn, "scaling") and hasattr(attn, "head_dim")):
        return f"its decoder layer ({type(layers[0]).__name__}) does not have the layout this forward runs"
    return None


def direct_decoder(model: torch.nn.Module, weights: str) -> DirectDecoder:
    """The :class:`DirectDecoder` of ``model``, kept beside it (rebuilt when a weight changed)."""
    key = (weights, *(weight_fingerprint(p) for p in model.parameters()))
    return kept_beside(_DECODERS, model, key, lambda: DirectDecoder(model, weights))


def drop_direct_decoder(model: torch.nn.Module) -> None:
    """Free ``model``'s :class:`DirectDecoder` and its low-bit copy, if one was made.

    Example:
        >>> drop_direct_decoder(torch.nn.Linear(2, 2))  # nothing was made: a no-op
    """
    _DECODERS.pop(model, None)
