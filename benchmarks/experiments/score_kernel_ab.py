"""The retrieval scoring kernels on a GPU, before and after 2026-11-28: chunk means and keys.

Until 2026-11-28 both package kernels multiplied with a float32 ``tl.dot`` (``ieee``, on Hopper's CUDA cores): the
chunk-mean one with the grouped query repeated over 16 columns (``tl.dot``'s smallest N, 16 times the multiply-adds
the scores need), the key one with the GQA group padded to 16 columns. On an H100 the first scored the 8B shape's
16,384 chunks of every layer at 342 GB/s (3.1 ms, most of a 128K refresh) against 2.85 TB/s (0.38 ms) for a
candidate that multiplies the tile by the query row and sums each row; the second read one layer's x4 nominees at
34 GB/s (0.75 ms, slower than its torch reference: 0.32 ms), ``benchmarks/results/h100-rescore-score-kernel-ab.json``.
Both package kernels now do row sums (``hf_triforce.kernels._retrieval_triton``); the previous ones are kept here
(``previous ...`` rows) to time them side by side, with the key kernel at three block sizes.

Each kernel is checked against float64 scores (the unit tests' bound, ``tests/unit/test_kernels_retrieval.py``)
before it is timed (``triton.testing.do_bench``, median ms), beside torch's own ``score_chunks`` (einsum in the input
dtype) and ``score_chunk_keys`` (a gathered copy of the keys, then a matmul): the chunk means at the stacked refresh's
one launch (all layers), the keys at one layer of the 8B shape with ``rescore_candidates=4`` (issue 18 item 3: what
re-scoring adds to a refresh).

Run on a GPU (about a minute; ``STEPS=score-ab bash benchmarks/gpu_run.sh`` does it)::

    python benchmarks/experiments/score_kernel_ab.py --output $OUT/score-kernel-ab.json

On the CPU, the correctness check alone under Triton's interpreter (small shapes, no timing)::

    TRITON_INTERPRET=1 python benchmarks/experiments/score_kernel_ab.py --device cpu
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import torch

from hf_triforce.evaluation.common.machine import machine_info
from hf_triforce.kernels import retrieval as kr

# (name, rows = layers x batch, query heads, KV heads, chunks, head dim): the stacked refresh's one launch
SHAPES = {
    "cuda": [("8b-32k", 32, 32, 8, 4096, 128), ("8b-128k", 32, 32, 8, 16384, 128), ("7b-64k", 32, 32, 32, 8192, 128)],
    "cpu": [("small", 2, 6, 2, 130, 64), ("smollm2", 30, 9, 3, 97, 64)],
}
KEY_BLOCKS = [16, 32, 64]  # BLOCK_F of the package's key kernel (the package picks 64 from 64 chosen chunks on)
EPS32 = torch.finfo(torch.float32).eps


@functools.cache
def previous_kernels():
    """The package's two ``tl.dot`` kernels before 2026-11-28, jitted on first use (after ``TRITON_INTERPRET``)."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n_chunks", "stride_ob", "stride_oh"])
    def means(
        q_ptr, s_ptr, out_ptr, kv_heads, n_chunks, head_dim,
        stride_qb, stride_qh, stride_qd, stride_sb, stride_sh, stride_sc, stride_sd, stride_ob, stride_oh, stride_oc,
        GROUP: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        pid_bh = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = (pid_bh // kv_heads).to(tl.int64)
        h = (pid_bh % kv_heads).to(tl.int64)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < head_dim
        q_row = q_ptr + b * stride_qb + (h * GROUP) * stride_qh + offs_d * stride_qd
        grouped = tl.zeros([BLOCK_D], tl.float32)
        for g in tl.static_range(GROUP):
            grouped += tl.load(q_row + g * stride_qh, mask=mask_d, other=0.0).to(tl.float32)
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask_c = offs_c < n_chunks
        s_ptrs = s_ptr + b * stride_sb + h * stride_sh + offs_c[:, None] * stride_sc + offs_d[None, :] * stride_sd
        s = tl.load(s_ptrs, mask=mask_c[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        scores = tl.dot(s, tl.broadcast_to(grouped[:, None], (BLOCK_D, BLOCK_N)), input_precision="ieee")
        cols = tl.arange(0, BLOCK_N)
        out_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_c[:, None] * stride_oc + cols[None, :] * 0
        tl.store(out_ptrs, scores, mask=mask_c[:, None] & (cols[None, :] == 0))

    @triton.jit(do_not_specialize=["n_chosen", "stride_cb", "stride_ch", "stride_ob", "stride_oh"])
    def keys(
        q_ptr, k_ptr, c_ptr, out_ptr, kv_heads, n_chosen, head_dim, group,
        stride_qb, stride_qh, stride_qd, stride_kb, stride_kh, stride_kl, stride_kd, stride_cb, stride_ch, stride_cf,
        stride_ob, stride_oh, stride_of, stride_on,
        CHUNK: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        pid_bh = tl.program_id(0)
        pid_f = tl.program_id(1)
        b = (pid_bh // kv_heads).to(tl.int64)
        h = (pid_bh % kv_heads).to(tl.int64)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < head_dim
        cols = tl.arange(0, BLOCK_N)
        mask_n = cols < group
        q_ptrs = q_ptr + b * stride_qb + (h * group + cols[None, :]) * stride_qh + offs_d[:, None] * stride_qd
        q = tl.load(q_ptrs, mask=mask_d[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
        mask_f = offs_f < n_chosen
        chunks = tl.load(c_ptr + b * stride_cb + h * stride_ch + offs_f * stride_cf, mask=mask_f, other=0)
        k_base = k_ptr + b * stride_kb + h * stride_kh + offs_d[None, :] * stride_kd
        mask_k = mask_f[:, None] & mask_d[None, :]
        best = tl.full([BLOCK_F, BLOCK_N], float("-inf"), tl.float32)
        for t in tl.static_range(CHUNK):
            rows = (chunks.to(tl.int64) * CHUNK + t)[:, None] * stride_kl
            k = tl.load(k_base + rows, mask=mask_k, other=0.0).to(tl.float32)
            best = tl.maximum(best, tl.dot(k, q, input_precision="ieee"))
        out_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_f[:, None] * stride_of + cols[None, :] * stride_on
        tl.store(out_ptrs, best, mask=mask_f[:, None] & mask_n[None, :])

    return means, keys


def previous_means(query: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """``[B, H_kv, C]`` float32 scores of the previous chunk-mean kernel (``score_chunks_triton``'s contract)."""
    import triton

    b, hq, d = query.shape
    hkv, n_chunks = summaries.shape[1], summaries.shape[2]
    out = torch.empty((b, hkv, n_chunks), dtype=torch.float32, device=summaries.device)
    grid = (b * hkv, triton.cdiv(n_chunks, 64))
    previous_kernels()[0][grid](
        query, summaries, out, hkv, n_chunks, d, *query.stride(), *summaries.stride(), *out.stride(),
        GROUP=hq // hkv, BLOCK_C=64, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=16,
    )  # fmt: skip
    return out


def previous_keys(query: torch.Tensor, keys: torch.Tensor, chunks: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[B, H_kv, F]`` float32 scores of the previous key kernel (``score_chunk_keys_triton``'s contract)."""
    import triton

    b, hq, d = query.shape
    hkv, n_chosen = keys.shape[1], chunks.shape[2]
    group = hq // hkv
    out = torch.empty((b, hkv, n_chosen, group), dtype=torch.float32, device=keys.device)
    grid = (b * hkv, triton.cdiv(n_chosen, 64))
    previous_kernels()[1][grid](
        query, keys, chunks, out, hkv, n_chosen, d, group,
        *query.stride(), *keys.stride(), *chunks.stride(), *out.stride(),
        CHUNK=chunk_size, BLOCK_F=64, BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_N=max(16, triton.next_power_of_2(group)),
    )  # fmt: skip
    return out.amax(-1)


def package_keys_block(
    query: torch.Tensor, keys: torch.Tensor, chunks: torch.Tensor, chunk_size: int, block_f: int
) -> torch.Tensor:
    """The package's key kernel launched with ``BLOCK_F = block_f`` (``score_chunk_keys_triton`` picks 16-64)."""
    import triton

    from hf_triforce.kernels._retrieval_triton import compiled_kernels
    from hf_triforce.kernels.dispatch import interpreting

    hkv, n_chosen, d = keys.shape[1], chunks.shape[2], keys.shape[3]
    out = torch.empty((query.shape[0], hkv, n_chosen), dtype=torch.float32, device=keys.device)
    compiled_kernels(interpreting()).chunk_keys[(query.shape[0] * hkv, triton.cdiv(n_chosen, block_f))](
        query, keys, chunks, out, hkv, n_chosen, d, query.shape[1] // hkv,
        *query.stride(), *keys.stride(), *chunks.stride(), *out.stride(),
        CHUNK=chunk_size, BLOCK_F=block_f, BLOCK_D=triton.next_power_of_2(d),
    )  # fmt: skip
    return out


def max_error_over_bound(got: torch.Tensor, query: torch.Tensor, summaries: torch.Tensor) -> float:
    """Largest ``|got - float64 truth| / bound`` (the unit tests' float32 bound); at most 1 is correct."""
    group, d = query.shape[1] // summaries.shape[1], query.shape[-1]
    return error_over_bound(got, kr.score_chunks, query, summaries, group + d)


def error_over_bound(got: torch.Tensor, reference, query: torch.Tensor, states: torch.Tensor, terms: int) -> float:
    """Largest ``|got - reference(float64 inputs)| / (terms * eps32 * reference(|query|, |states|))``."""
    truth = reference(query.double(), states.double())
    bound = terms * EPS32 * reference(query.double().abs(), states.double().abs())
    return float(((got.double() - truth).abs() / bound.clamp_min(1e-300)).max())


def timed_ms(fn, device: str) -> float | None:
    if device != "cuda":
        return None
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def run(device: str) -> list[dict]:
    """One row per shape and kernel: error over bound, median ms, GB/s of summaries read."""
    return [row for shape in SHAPES[device] for row in shape_rows(device, *shape)]


def shape_rows(device: str, name: str, rows: int, hq: int, hkv: int, chunks: int, d: int) -> list[dict]:
    """Every kernel at one shape, then torch's einsum (timed only)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    query = torch.randn(rows, hq, d, device=device, generator=g).to(dtype)
    summaries = torch.randn(rows, hkv, chunks, d, device=device, generator=g).to(dtype)
    gb = summaries.numel() * summaries.element_size() / 1e9
    kernels = {"package": functools.partial(kr.score_chunks_triton, query, summaries),
               "previous (tl.dot)": functools.partial(previous_means, query, summaries)}  # fmt: skip
    out = []
    for label, fn in kernels.items():
        ms = timed_ms(fn, device)
        out.append({"shape": name, "kernel": label, "error_over_bound": max_error_over_bound(fn(), query, summaries),
                    "ms": ms, "gb_per_s": None if ms is None else gb / ms * 1e3})  # fmt: skip
        print(out[-1], flush=True)
    ms = timed_ms(functools.partial(kr.score_chunks, query, summaries), device)
    out.append({"shape": name, "kernel": "torch einsum", "error_over_bound": None, "ms": ms,
                "gb_per_s": None if ms is None else gb / ms * 1e3})  # fmt: skip
    return out


# (name, query heads, KV heads, cached tokens, nominated chunks, chunk size, head dim): one layer's re-scoring with
# rescore_candidates=4 (the refresh does it once per layer): at 128K, budget 4096, the "auto" window (1024 tokens)
KEY_SHAPES = {
    "cuda": [("8b-128k-x4", 32, 8, 131072, 1532, 8, 128), ("8b-32k-x4", 32, 8, 32768, 1532, 8, 128)],
    "cpu": [("small-x4", 9, 3, 2048, 37, 8, 64)],
}


def key_rows(device: str) -> list[dict]:
    """``score_chunk_keys_triton`` (the keys read where they lie) against its torch reference ``score_chunk_keys`` (a
    gathered copy, then a matmul): error over the unit tests' bound, median ms, GB/s of nominated keys read."""
    return [row for shape in KEY_SHAPES[device] for row in key_shape_rows(device, *shape)]


def key_shape_rows(device: str, name: str, hq: int, hkv: int, length: int, f: int, c: int, d: int) -> list[dict]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(1)
    query = torch.randn(1, hq, d, device=device, generator=g).to(dtype)
    keys = torch.randn(1, hkv, length, d, device=device, generator=g).to(dtype)
    chunks = torch.stack([torch.randperm(length // c - 1, device=device, generator=g)[:f] + 1 for _ in range(hkv)])
    args = (query, keys, chunks[None], c)
    gb = hkv * f * c * d * keys.element_size() / 1e9
    out = []
    kernels = {"package keys": kr.score_chunk_keys_triton, "previous keys (tl.dot)": previous_keys}
    kernels |= {f"package keys f{f}": functools.partial(package_keys_block, block_f=f) for f in KEY_BLOCKS}
    for label, fn in (*kernels.items(), ("torch gather+matmul", kr.score_chunk_keys)):
        ms = timed_ms(functools.partial(fn, *args), device)
        out.append({"shape": name, "kernel": label, "error_over_bound": key_error_over_bound(fn(*args), *args),
                    "ms": ms, "gb_per_s": None if ms is None else gb / ms * 1e3})  # fmt: skip
        print(out[-1], flush=True)
    return out


def key_error_over_bound(got: torch.Tensor, query: torch.Tensor, keys: torch.Tensor, chunks: torch.Tensor, c: int):
    """Largest ``|got - float64 truth| / bound``, the bound ``D * eps32 * max |q| . |k|`` of the unit tests."""
    reference = functools.partial(kr.score_chunk_keys, chunks=chunks, chunk_size=c)
    return error_over_bound(got, reference, query, keys, query.shape[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--output", default="score-kernel-ab.json")
    args = parser.parse_args()
    rows = run(args.device) + key_rows(args.device)
    with open(args.output, "w") as f:
        json.dump({"command": " ".join(["python", *sys.argv]), "machine": machine_info(), "rows": rows}, f, indent=1)
    bad = [r for r in rows if r["error_over_bound"] is not None and r["error_over_bound"] > 1]
    if bad:
        raise SystemExit(f"{len(bad)} kernel(s) outside the float32 error bound: {bad}")


if __name__ == "__main__":
    main()
