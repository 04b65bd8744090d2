"""Would a compiled level-1 step pay on the CPU? Level 1's direct forward (int4 projections, int8 head) written as one
fixed-shape function over fixed-capacity key/value storage (a causal mask over the capacity, the new keys written in
place), run eagerly and through ``torch.compile`` (inductor's C++ backend): the step time at widths 1 and 3 and what
compiling each width costs, the counterpart of the CUDA graphs a GPU captures.

    python -m research.compiled_level1 --output benchmarks/results/counts-not-clocks/compiled-level1.json

The keys and values are random (a step's cost does not depend on their values); the capacity is a 512-token view
plus the room a call keeps. Run it alone: on 2 cores anything else running moves the timings.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hf_triforce.bench.machine import machine_info
from hf_triforce.bench.smollm2 import load_smollm2
from hf_triforce.hf.direct_forward import DirectDecoder
from hf_triforce.hf.model import apply_rope

from .phase_costs import median_seconds


def _int4(x: torch.Tensor, projection) -> torch.Tensor:
    w = projection.low_bit
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    return mm(x.to(torch.bfloat16), w.packed, w.group_size, w.scales_and_zeros).float()


def fixed_shape_step(decoder: DirectDecoder, tokens, positions, length, keys, values) -> torch.Tensor:
    """Logits ``[w, V]`` of ``tokens`` ``[w]`` at ``positions``; their keys/values written at slots ``length ..`` of
    the fixed-capacity ``keys``/``values`` (per layer ``[1, H_kv, C, D]``), attention masked to the filled slots."""
    w, capacity = tokens.shape[0], keys[0].shape[2]
    first = decoder.layers[0]
    heads, kv_heads, d = first.heads, first.kv_heads, first.head_dim
    x = decoder.embed.weight[tokens]
    cos, sin = decoder.rotary(x[None], positions[None])
    cos, sin = cos[0, :, None], sin[0, :, None]
    slots = length + torch.arange(w)
    visible = torch.arange(capacity)[None, :] <= slots[:, None]  # [w, C]
    mask = visible.repeat(heads // kv_heads, 1)[None, None]  # packed rows
    for layer, k_store, v_store in zip(decoder.layers, keys, values, strict=True):
        h = _rms(x, layer.input_norm)
        states = _int4(h, layer.qkv).view(w, heads + 2 * kv_heads, d)
        rotated = apply_rope(states[:, : heads + kv_heads], cos, sin)
        query, key, value = rotated[:, :heads], rotated[:, heads:], states[:, heads + kv_heads :]
        k_store.index_copy_(2, slots, key.transpose(0, 1)[None])
        v_store.index_copy_(2, slots, value.transpose(0, 1)[None])
        packed = query.transpose(0, 1).reshape(1, kv_heads, heads // kv_heads * w, d)
        out = F.scaled_dot_product_attention(packed, k_store, v_store, attn_mask=mask, scale=layer.scaling)
        x = x + _int4(out.reshape(heads, w, d).transpose(0, 1).reshape(w, heads * d), layer.o)
        gate, up = _int4(_rms(x, layer.post_norm), layer.gate_up).chunk(2, dim=-1)
        x = x + _int4(F.silu(gate) * up, layer.down)
    return decoder.head(_rms(x, decoder.norm))


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)


def median_ms(fn, repeats: int = 25, warmup: int = 5) -> float:
    return 1e3 * median_seconds(fn, repeats, warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=544)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, _ = load_smollm2()
    decoder = DirectDecoder(model, "int4")
    first = decoder.layers[0]
    shape = (1, first.kv_heads, args.capacity, first.head_dim)
    keys = [torch.randn(shape) for _ in decoder.layers]
    values = [torch.randn(shape) for _ in decoder.layers]
    length = torch.tensor(args.capacity - 40)
    compiled = torch.compile(fixed_shape_step, dynamic=False)
    rows = []
    with torch.no_grad():
        for width in (1, 3):
            tokens, positions = torch.randint(0, 1000, (width,)), torch.arange(7000, 7000 + width)
            step = functools.partial(fixed_shape_step, decoder, tokens, positions, length, keys, values)
            fast = functools.partial(compiled, decoder, tokens, positions, length, keys, values)
            start = time.perf_counter()
            fast()
            compile_s = time.perf_counter() - start
            rows.append({"width": width, "eager_ms": median_ms(step), "compiled_ms": median_ms(fast),
                         "compile_seconds": compile_s})  # fmt: skip
    result = {
        "command": f"python -m research.compiled_level1 --capacity {args.capacity}",
        "machine": machine_info(),
        "rows": rows,
    }
    for row in rows:
        saved = row["eager_ms"] - row["compiled_ms"]
        print(
            f"width {row['width']}: eager {row['eager_ms']:.1f} ms, compiled {row['compiled_ms']:.1f} ms "
            f"(saves {saved:.1f} ms a step), compiling took {row['compile_seconds']:.0f} s: paid back after "
            f"{row['compile_seconds'] * 1e3 / max(saved, 1e-9):.0f} steps"
        )
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
