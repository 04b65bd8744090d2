"""Triton retrieval kernels (hf_triforce.kernels.retrieval) against their pure-torch references.

On the CPU the kernels run under Triton's interpreter: the ``triton_mode`` fixture (tests/unit/conftest.py)
sets ``TRITON_INTERPRET=1`` with ``monkeypatch`` for each test of this module only, and it is gone after
each test. That works
although Triton is already imported by then (transformers imports torch._dynamo, which imports it, at
collection): ``triton.jit`` reads the variable when it decorates, and the package's kernels are jitted
lazily, once per mode, on first launch; they also call nothing from Triton's own ``@jit`` standard
library (``tl.sum``, ``tl.zeros``...), which was built in compiled mode at that first import. The
``gpu`` test instead removes the variable and runs the compiled kernels on CUDA.

Scores: the kernel accumulates in float32 and returns float32, so it is held to (a) the worst-case
float32 rounding bound of its sums against float64 scores of the same inputs, and (b) the flash-attn
criterion: its error against float64 is at most twice torch's own error in the input dtype, plus
that bound. The gather must be bit-exact, and write nothing outside its slots.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from hf_triforce.caches.retrieval import RetrievalCache  # noqa: E402
from hf_triforce.caches.selection import LOOKAHEAD, nominate_chunks, select_token_indices, spread_forward  # noqa: E402
from hf_triforce.kernels import retrieval as kr  # noqa: E402
from hf_triforce.kernels.dispatch import DISABLE_ENV  # noqa: E402
from hf_triforce.kernels.retrieval import chunk_means, gather_tokens, score_chunk_keys, score_chunks  # noqa: E402

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("triton_mode")]

HEADS = [(4, 4), (9, 3), (32, 8)]  # (H_q, H_kv): MHA, SmolLM2's GQA, Llama-3-8B's GQA
HEAD_DIMS = [64, 128]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS32 = torch.finfo(torch.float32).eps
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns (so ``-0.0 != 0.0`` and a NaN equals itself): bit-exactness, not value equality."""
    return t.contiguous().view(_BITS[t.element_size()])


def _assert_scores_close(got: torch.Tensor, query: torch.Tensor, summaries: torch.Tensor) -> None:
    """Kernel scores against float64 scores of the same inputs, with a float32 error bound derived from the shapes.

    Every score is a float32 sum of ``G * D`` products (``G`` query heads per KV head, head dim ``D``), in an
    order that depends on the hardware; the classic bound for that is ``(G + D) * eps32 * sum |q| |s|``. Then
    the flash-attn criterion: no worse than twice torch's own error in the input dtype, plus that bound.
    """
    assert got.dtype == torch.float32
    group, head_dim = query.shape[1] // summaries.shape[1], query.shape[-1]
    _assert_within_float32_bound(got, score_chunks, query, summaries, group + head_dim)


def _assert_within_float32_bound(got, reference, query, states, terms: int) -> None:
    """``got`` against ``reference(query, states)`` over float64 inputs: within ``terms * eps32 * reference(|query|,
    |states|)`` everywhere, and no worse than twice the reference's own error in the input dtype plus that bound."""
    if got.numel() == 0:
        return
    truth = reference(query.double(), states.double())
    bound = terms * EPS32 * reference(query.double().abs(), states.double().abs())
    err = (got.double() - truth).abs()
    assert bool((err <= bound).all()), f"max error {float(err.max()):.3g}, max bound {float(bound.max()):.3g}"
    torch_err = (reference(query, states).double() - truth).abs().max()
    assert err.max() <= 2 * torch_err + bound.max()


def _middle_chunks(row: list[int], length: int, chunk: int, recent_window: int) -> list[int]:
    """The retrieved chunk ids of one head's sorted token indices (sink chunk and recent tokens removed)."""
    recent_start = max(chunk, (length - recent_window) // chunk * chunk)
    return sorted({t // chunk for t in row if chunk <= t < recent_start})


# --------------------------------------------------------------------------------------------------------------
# chunk scoring
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("q_heads,kv_heads", HEADS)
def test_score_kernel_matches_reference(q_heads, kv_heads, head_dim, dtype):
    g = _gen(q_heads * 1000 + head_dim)
    batch, n_chunks = 2, 37  # not a multiple of the chunk block: a masked tail block
    # the captured query is the last position of a [B, H_q, q, D] tensor: not contiguous
    query = torch.randn(batch, q_heads, 3, head_dim, generator=g).to(dtype)[:, :, -1]
    # summaries are a slice of the cache's growable summary buffer: not contiguous either
    summaries = (torch.randn(batch, kv_heads, n_chunks + 11, head_dim, generator=g) / 3).to(dtype)[:, :, :n_chunks]
    got = kr.score_chunks_triton(query, summaries)
    assert got.shape == (batch, kv_heads, n_chunks) and got.is_contiguous()
    _assert_scores_close(got, query, summaries)


@pytest.mark.parametrize("n_chunks", [0, 1, 64, 65])
def test_score_kernel_edge_chunk_counts(n_chunks):
    g = _gen(n_chunks)
    query, summaries = torch.randn(1, 6, 64, generator=g), torch.randn(1, 2, n_chunks, 64, generator=g)
    got = kr.score_chunks_triton(query, summaries)
    assert got.shape == (1, 2, n_chunks)
    _assert_scores_close(got, query, summaries)


def test_score_kernel_on_real_chunk_means():
    """Summaries as ``chunk_means`` makes them, scored with a query sharing their direction (large, signed scores)."""
    g = _gen(5)
    keys = torch.randn(1, 3, 16 * 40, 64, generator=g).to(torch.bfloat16)
    summaries = chunk_means(keys, 16)
    query = summaries[:, :, 7].repeat_interleave(3, dim=1) * 4 + torch.randn(1, 9, 64, generator=g).to(torch.bfloat16)
    _assert_scores_close(kr.score_chunks_triton(query, summaries), query, summaries)


def test_score_kernel_compiles_one_variant_for_every_chunk_count(monkeypatch):
    """No integer argument that Triton specializes (on being 1 or a multiple of 16) changes its class with the chunk
    count, so the compiled kernel does not recompile as the context grows. Specialized, the scores' strides (multiples
    of the count) made Triton compile three variants, 0.67-0.93 s each on an H200, inside a refresh
    (``benchmarks/results/h200-stacked-gpu-run.log``). The arguments are read from two real launches, an odd count
    and a multiple of 16; the summaries' strides (multiples of ``head_dim``, 128) stay specialized, for aligned
    loads."""
    g = _gen(6)

    def launch_twice():
        for n_chunks in (683, 4096):  # odd; a multiple of 16
            kr.score_chunks_triton(torch.randn(2, 32, 128, generator=g), torch.randn(2, 8, n_chunks, 128, generator=g))

    changed, specialized = _specialization_changes(monkeypatch, "score", launch_twice)
    assert changed == []
    assert specialized >= {"stride_sb", "stride_sh", "head_dim"}  # still specialized


def _specialization_changes(monkeypatch, name: str, launch_twice) -> tuple[list[str], set[str]]:
    """Record the arguments of the two launches of kernel ``name`` that ``launch_twice()`` makes; return the integer
    arguments Triton specializes (on being 1 or a multiple of 16) whose class differs between them, and all the
    specialized ones. Leaves the interpreter off (to read the compiled-mode kernel's parameters)."""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **constexprs: launches.append(args)

    monkeypatch.setattr(kr, "_kernels", lambda: SimpleNamespace(**{name: Recorder()}))
    launch_twice()
    monkeypatch.delenv("TRITON_INTERPRET")
    from hf_triforce.kernels._retrieval_triton import compiled_kernels

    params = getattr(compiled_kernels.__wrapped__(False), name).params  # compiled mode, outside the mode cache
    first, second = launches
    specialized = [i for i, arg in enumerate(first) if isinstance(arg, int) and not params[i].do_not_specialize]

    def variant(value: int) -> tuple[bool, bool]:
        return value == 1, value % 16 == 0

    changed = [params[i].name for i in specialized if variant(first[i]) != variant(second[i])]
    return changed, {params[i].name for i in specialized}


def test_score_kernel_rejects_bad_shapes_and_cpu_without_interpreter(monkeypatch):
    with pytest.raises(ValueError, match="incompatible"):
        kr.score_chunks_triton(torch.randn(1, 5, 8), torch.randn(1, 2, 3, 8))  # 5 query heads, 2 KV heads
    with pytest.raises(ValueError, match="expected query"):
        kr.score_chunks_triton(torch.randn(1, 4, 1, 8), torch.randn(1, 2, 3, 8))
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="CUDA"):
        kr.score_chunks_triton(torch.randn(1, 4, 8), torch.randn(1, 2, 3, 8))


# --------------------------------------------------------------------------------------------------------------
# scoring chosen chunks by their keys
# --------------------------------------------------------------------------------------------------------------


def _assert_key_scores_close(got, query, keys, chunks, chunk) -> None:
    """Kernel key scores against float64 ones of the same inputs. Each is the largest of float32 dot products of
    ``D`` terms, each within ``D * eps32 * sum |q| |k|`` of its exact value, so the largest is within the largest
    such bound; then the flash-attn criterion against the reference in the input dtype."""
    assert got.dtype == torch.float32 and got.shape == chunks.shape
    reference = functools.partial(score_chunk_keys, chunks=chunks, chunk_size=chunk)
    _assert_within_float32_bound(got, reference, query, keys, query.shape[-1])


@pytest.mark.parametrize("per_head", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("q_heads,kv_heads", HEADS)
def test_chunk_key_kernel_matches_reference(q_heads, kv_heads, head_dim, dtype, per_head):
    """Chosen chunks (any order, a masked tail block) scored where they lie in a slice of a larger buffer, by a
    non-contiguous query; ``per_head`` queries per query head (level 1's multi-token forwards) widen the group."""
    g = _gen(q_heads * 100 + head_dim + per_head)
    batch, chunk, n_chunks, chosen = 2, 8, 60, 37
    query = torch.randn(batch, q_heads * per_head, 3, head_dim, generator=g).to(dtype)[:, :, -1]
    buffer = torch.randn(batch, kv_heads, n_chunks * chunk + 40, head_dim, generator=g).to(dtype)
    keys = buffer[:, :, : n_chunks * chunk + 5]  # a trailing partial chunk, never chosen
    rows = [torch.randperm(n_chunks, generator=g)[:chosen] for _ in range(batch * kv_heads)]
    chunks = torch.stack(rows).view(batch, kv_heads, chosen)
    _assert_key_scores_close(kr.score_chunk_keys_triton(query, keys, chunks, chunk), query, keys, chunks, chunk)


@pytest.mark.parametrize("chosen,chunk", [(0, 8), (1, 8), (64, 16), (65, 4)])
def test_chunk_key_kernel_edge_counts(chosen, chunk):
    g = _gen(chosen + chunk)
    query, keys = torch.randn(1, 6, 64, generator=g), torch.randn(1, 2, 70 * chunk, 64, generator=g)
    chunks = torch.randint(0, 70, (1, 2, chosen), generator=g)  # repeats allowed: each scored alike
    got = kr.score_chunk_keys_triton(query, keys, chunks, chunk)
    _assert_key_scores_close(got, query, keys, chunks, chunk)


def test_chunk_key_kernel_finds_the_one_token_that_stands_out():
    """A chunk whose mean key is unremarkable but one token of which one query head of the group attends to
    strongly scores that logit (what re-scoring by keys is for)."""
    keys = torch.zeros(1, 1, 32, 16)
    keys[0, 0, 21, 3] = 5.0  # chunk 2, token 5
    query = torch.zeros(1, 4, 16)
    query[0, 2, 3] = 1.0  # the group's third query head
    got = kr.score_chunk_keys_triton(query, keys, torch.tensor([[[3, 2, 0]]]), 8)
    assert got.tolist() == [[[0.0, 5.0, 0.0]]]


def test_chunk_key_kernel_compiles_one_variant_for_every_chosen_count(monkeypatch):
    """As for the scoring kernel: no specialized integer argument changes its class between an odd count of chosen
    chunks and a multiple of 16 (the count follows the context's length), so the kernel does not recompile."""
    g = _gen(7)
    keys = torch.randn(1, 8, 16 * 5000, 128, generator=g)

    def launch_twice():
        for chosen in (683, 4096):
            query, chunks = torch.randn(1, 32, 128, generator=g), torch.zeros(1, 8, chosen).long()
            kr.score_chunk_keys_triton(query, keys, chunks, 16)

    changed, specialized = _specialization_changes(monkeypatch, "chunk_keys", launch_twice)
    assert changed == []
    assert specialized >= {"stride_kh", "stride_kl", "head_dim"}  # still specialized


def test_chunk_key_kernel_rejects_bad_inputs(monkeypatch):
    query, keys, chunks = torch.randn(1, 4, 8), torch.randn(1, 2, 24, 8), torch.zeros(1, 2, 3).long()
    with pytest.raises(ValueError, match="incompatible"):
        kr.score_chunk_keys_triton(torch.randn(1, 5, 8), keys, chunks, 8)  # 5 query heads, 2 KV heads
    with pytest.raises(ValueError, match="incompatible"):
        kr.score_chunk_keys_triton(query, keys, torch.zeros(1, 3, 3).long(), 8)  # chunks of 3 heads
    with pytest.raises(ValueError, match="expected query"):
        kr.score_chunk_keys_triton(query, keys[0], chunks, 8)
    with pytest.raises(ValueError, match="integer"):
        kr.score_chunk_keys_triton(query, keys, chunks.float(), 8)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="CUDA"):
        kr.score_chunk_keys_triton(query, keys, chunks, 8)


# --------------------------------------------------------------------------------------------------------------
# gather into the view
# --------------------------------------------------------------------------------------------------------------


def _storage_and_view(batch, heads, slots, spare, head_dim, dtype, g):
    """Preallocated view storage ``[B, H, slots + spare, D]`` (random garbage) and its first ``slots`` slots."""
    storage = torch.randn(batch, heads, slots + spare, head_dim, generator=g).to(dtype)
    return storage, storage[:, :, :slots]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("q_heads,kv_heads", HEADS)
def test_gather_kernel_is_bit_exact(q_heads, kv_heads, head_dim, dtype):
    del q_heads  # the gather works per KV head
    g = _gen(kv_heads * 100 + head_dim)
    batch, length, chunk, budget, window = 2, 203, 8, 64, 16
    full_k = torch.randn(batch, kv_heads, length + 13, head_dim, generator=g).to(dtype)
    full_v = torch.randn(batch, kv_heads, length + 13, head_dim, generator=g).to(dtype)
    keys, values = full_k[:, :, :length], full_v[:, :, :length]  # the cache's live slots: strided
    scores = torch.randn(batch, kv_heads, length // chunk, generator=g)
    indices = select_token_indices(scores, length, chunk, budget, window)
    slots = indices.shape[-1]
    store_k, out_k = _storage_and_view(batch, kv_heads, slots, 9, head_dim, dtype, g)
    store_v, out_v = _storage_and_view(batch, kv_heads, slots, 9, head_dim, dtype, g)
    spare_k, spare_v = store_k[:, :, slots:].clone(), store_v[:, :, slots:].clone()
    source_k, source_v = full_k.clone(), full_v.clone()

    kr.gather_kv_triton(keys, values, indices, out_k, out_v)

    assert torch.equal(_bits(out_k), _bits(gather_tokens(keys, indices)))
    assert torch.equal(_bits(out_v), _bits(gather_tokens(values, indices)))
    assert torch.equal(_bits(store_k[:, :, slots:]), _bits(spare_k)), "wrote past the gathered slots"
    assert torch.equal(_bits(store_v[:, :, slots:]), _bits(spare_v)), "wrote past the gathered slots"
    assert torch.equal(_bits(full_k), _bits(source_k)) and torch.equal(_bits(full_v), _bits(source_v))


@pytest.mark.parametrize(
    "make_indices",
    [
        lambda length, g: torch.arange(length).expand(2, 3, length),  # everything fits: stride-0 rows
        lambda length, g: torch.randint(0, length, (2, 3, 70), generator=g),  # unsorted, repeated
        lambda length, g: torch.randint(0, length, (2, 3, 5), generator=g).to(torch.int32),
        lambda length, g: torch.zeros(2, 3, 0, dtype=torch.long),  # nothing to gather
    ],
    ids=["expanded-arange", "random-repeats", "int32", "empty"],
)
def test_gather_kernel_any_indices(make_indices):
    g = _gen(3)
    length = 50
    keys, values = torch.randn(2, 3, length, 64, generator=g), torch.randn(2, 3, length, 64, generator=g)
    indices = make_indices(length, g)
    out_k = torch.empty(2, 3, indices.shape[-1], 64)
    out_v = torch.empty_like(out_k)
    kr.gather_kv_triton(keys, values, indices, out_k, out_v)
    assert torch.equal(_bits(out_k), _bits(gather_tokens(keys, indices.long())))
    assert torch.equal(_bits(out_v), _bits(gather_tokens(values, indices.long())))


def test_gather_kernel_rejects_mismatched_outputs():
    keys = torch.randn(1, 2, 10, 8)
    indices = torch.zeros(1, 2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="out_keys"):
        kr.gather_kv_triton(keys, keys, indices, torch.empty(1, 2, 5, 8), torch.empty(1, 2, 4, 8))
    with pytest.raises(ValueError, match="indices"):
        kr.gather_kv_triton(keys, keys, indices.float(), torch.empty(1, 2, 4, 8), torch.empty(1, 2, 4, 8))
    with pytest.raises(ValueError, match="values"):
        kr.gather_kv_triton(keys, keys.half(), indices, torch.empty(1, 2, 4, 8), torch.empty(1, 2, 4, 8))


# --------------------------------------------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------------------------------------------


def test_dispatch_uses_the_reference_on_cpu(monkeypatch):
    """CPU tensors never reach Triton, even with the interpreter on: results are the references' exactly."""

    def refuse(*args, **kwargs):
        raise AssertionError("a Triton kernel ran for CPU tensors")

    monkeypatch.setattr(kr, "score_chunks_triton", refuse)
    monkeypatch.setattr(kr, "score_chunk_keys_triton", refuse)
    monkeypatch.setattr(kr, "gather_kv_triton", refuse)
    g = _gen(8)
    query, summaries = torch.randn(1, 9, 16, generator=g), torch.randn(1, 3, 12, 16, generator=g)
    assert torch.equal(kr.chunk_scores(query, summaries), score_chunks(query, summaries))
    keys, chunks = torch.randn(1, 3, 96, 16, generator=g), torch.randint(0, 12, (1, 3, 5), generator=g)
    assert torch.equal(kr.chunk_key_scores(query, keys, chunks, 8), score_chunk_keys(query, keys, chunks, 8))
    keys, values = torch.randn(1, 3, 30, 16, generator=g), torch.randn(1, 3, 30, 16, generator=g)
    indices = torch.randint(0, 30, (1, 3, 7), generator=g)
    out_k, out_v = torch.empty(1, 3, 7, 16), torch.empty(1, 3, 7, 16)
    kr.gather_kv_into(keys, values, indices, out_k, out_v)
    assert torch.equal(out_k, gather_tokens(keys, indices)) and torch.equal(out_v, gather_tokens(values, indices))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_gather_into_slices_of_larger_buffers(dtype):
    """The CPU row-copy path (one ``index_select`` per batch row and KV head) writes exactly the reference's tokens
    into the first slots of a larger storage, from a source that is itself a slice of a longer buffer; a
    destination whose rows are not contiguous takes the reference path, with the same result."""
    g = _gen(9)
    full_k, full_v = (torch.randn(2, 3, 50, 16, generator=g).to(dtype) for _ in range(2))
    keys, values = full_k[:, :, :41], full_v[:, :, :41]
    indices = torch.randint(0, 41, (2, 3, 13), generator=g)
    storage_k, storage_v = torch.zeros(2, 3, 20, 16, dtype=dtype), torch.zeros(2, 3, 20, 16, dtype=dtype)
    kr.gather_kv_into(keys, values, indices, storage_k[:, :, :13], storage_v[:, :, :13])
    assert torch.equal(storage_k[:, :, :13], gather_tokens(keys, indices))
    assert torch.equal(storage_v[:, :, :13], gather_tokens(values, indices))
    assert not storage_k[:, :, 13:].any() and not storage_v[:, :, 13:].any()
    out_k = torch.zeros(2, 3, 16, 13, dtype=dtype).transpose(-1, -2)  # [2, 3, 13, 16] with strided rows
    out_v = torch.zeros_like(out_k)
    kr.gather_kv_into(keys, values, indices, out_k, out_v)
    assert torch.equal(out_k, gather_tokens(keys, indices)) and torch.equal(out_v, gather_tokens(values, indices))


@pytest.mark.parametrize("value,enabled", [(None, True), ("1", False), ("true", False), ("0", True), ("", True)])
def test_triton_enabled_for_cuda_tensors_unless_disabled(monkeypatch, value, enabled):
    cuda_like = SimpleNamespace(is_cuda=True)  # stands in for a CUDA tensor: only ``is_cuda`` is read
    if value is not None:
        monkeypatch.setenv(DISABLE_ENV, value)
    assert kr.triton_enabled(cuda_like, cuda_like) is enabled
    assert kr.triton_enabled(cuda_like, torch.zeros(1)) is False  # one CPU tensor: the reference
    assert kr.triton_enabled() is False


# --------------------------------------------------------------------------------------------------------------
# end to end: RetrievalCache.select / RetrievalView over the kernels
# --------------------------------------------------------------------------------------------------------------


def _filled_cache(g, layers, kv_heads, length, head_dim, dtype, chunk):
    cache = RetrievalCache(num_layers=layers, chunk_size=chunk, capacity=length + 7)
    for layer in range(layers):
        k = torch.randn(1, kv_heads, length, head_dim, generator=g).to(dtype)
        v = torch.randn(1, kv_heads, length, head_dim, generator=g).to(dtype)
        cache.update(k, v, layer)
    return cache


def _attention_by_hand(query, full_k, full_v, indices, new_k, new_v) -> torch.Tensor:
    """float64 attention of one new token ``[1, H_q, 1, D]`` over its KV head's gathered tokens plus itself."""
    _, hq, _, d = query.shape
    group = hq // full_k.shape[1]
    out = torch.zeros(1, hq, 1, d, dtype=torch.float64)
    for j in range(hq):
        h = j // group
        rows = [int(t) for t in indices[0, h]]
        keys = torch.stack([full_k[0, h, t] for t in rows] + [new_k[0, h, 0]]).double()
        values = torch.stack([full_v[0, h, t] for t in rows] + [new_v[0, h, 0]]).double()
        weights = torch.softmax(keys @ query[0, j, 0].double() / math.sqrt(d), dim=0)
        out[0, j, 0] = weights @ values
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_heads,kv_heads", HEADS)
def test_view_from_kernels_equals_reference_path(monkeypatch, q_heads, kv_heads, dtype):
    """Kernel scores choose the chunks, the kernel gathers the view; attention over it equals attention by hand.

    The wiring in ``RetrievalCache.select`` / ``RetrievalView`` is exercised by letting the dispatch take
    the Triton path for these CPU tensors (interpreted). In float32 the chosen chunks must equal the
    reference path's; in float16/bfloat16 the reference rounds its scores to the input dtype (ties), so
    the kernel's choice is checked against float64 scores instead: a top-k of them, up to near-ties.
    """
    g = _gen(q_heads + kv_heads)
    layers, length, chunk, budget, window, head_dim = 2, 203, 8, 64, 16, 64
    cache = _filled_cache(g, layers, kv_heads, length, head_dim, dtype, chunk)
    queries = [torch.randn(1, q_heads, head_dim, generator=g).to(dtype) for _ in range(layers)]
    ref_indices = cache.select(queries, budget, window)
    ref_view = cache.sparse_view(ref_indices, extra_capacity=4)

    calls = {"score": 0, "gather": 0}
    score, gather = kr.score_chunks_triton, kr.gather_kv_triton

    def counted_score(*args):
        calls["score"] += 1
        return score(*args)

    def counted_gather(*args):
        calls["gather"] += 1
        return gather(*args)

    monkeypatch.setattr(kr, "triton_enabled", lambda *tensors: True)
    monkeypatch.setattr(kr, "score_chunks_triton", counted_score)
    monkeypatch.setattr(kr, "gather_kv_triton", counted_gather)
    indices = cache.select(queries, budget, window)
    view = cache.sparse_view(indices, extra_capacity=4)
    assert calls == {"score": 1, "gather": layers}  # one scoring launch for the layers stacked, a gather each

    for layer in range(layers):
        full = cache.layers[layer].buffer
        truth = score_chunks(queries[layer].double(), cache.layers[layer].summaries().double())[0]
        truth[:, 1:] = spread_forward(truth[:, 1:], LOOKAHEAD)  # a chunk also lifts the one after it
        if dtype == torch.float32:
            assert torch.equal(indices[layer], ref_indices[layer])
        for h in range(kv_heads):
            chosen = _middle_chunks(indices[layer][0, h].tolist(), length, chunk, window)
            candidates = range(1, _middle_chunks(list(range(length)), length, chunk, window)[-1] + 1)
            others = [c for c in candidates if c not in chosen]
            tie = 1e-4 * float(truth[h].abs().max())
            assert min(float(truth[h, c]) for c in chosen) >= max(float(truth[h, c]) for c in others) - tie
        # the view holds exactly the selected tokens, bit for bit, and nothing else was allocated
        view_layer = view.layers[layer]
        assert torch.equal(_bits(view_layer.buffer.keys), _bits(gather_tokens(full.keys, indices[layer])))
        assert torch.equal(_bits(view_layer.buffer.values), _bits(gather_tokens(full.values, indices[layer])))
        assert view_layer.buffer.nbytes() == ref_view.layers[layer].buffer.nbytes()

        # one level-1 step over the view: attention over its keys equals attention over them gathered by hand
        new_k, new_v = (torch.randn(1, kv_heads, 1, head_dim, generator=g).to(dtype) for _ in range(2))
        q = torch.randn(1, q_heads, 1, head_dim, generator=g).to(dtype)
        keys, values = view.update(new_k, new_v, layer)
        expected = _attention_by_hand(q, full.keys, full.values, indices[layer], new_k, new_v)
        group = q_heads // kv_heads
        exact = torch.nn.functional.scaled_dot_product_attention(
            q.double(), keys.double().repeat_interleave(group, 1), values.double().repeat_interleave(group, 1)
        )
        torch.testing.assert_close(exact, expected, atol=1e-12, rtol=1e-12)
        native = torch.nn.functional.scaled_dot_product_attention(q, keys, values, enable_gqa=group > 1)
        tol = 4 * torch.finfo(dtype).eps
        torch.testing.assert_close(native.double(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("rescore", [2, 5])
def test_rescored_selection_from_kernels_equals_reference_path(monkeypatch, rescore):
    """``rescore_candidates``: with the dispatch taking the Triton path for these CPU tensors (interpreted), the
    stacked selection scores the nominees of each layer with one key-scoring launch and chooses what the reference
    path chooses (float32)."""
    g = _gen(rescore)
    layers, length, chunk, budget, window, head_dim = 3, 331, 8, 64, 16, 64
    cache = _filled_cache(g, layers, 3, length, head_dim, torch.float32, chunk)
    queries = [torch.randn(1, 9, head_dim, generator=g) for _ in range(layers)]
    reference = cache.select(queries, budget, window, rescore_candidates=rescore)
    calls = []
    kernel = kr.score_chunk_keys_triton
    monkeypatch.setattr(kr, "triton_enabled", lambda *tensors: True)
    monkeypatch.setattr(kr, "score_chunk_keys_triton", lambda *args: calls.append(args) or kernel(*args))
    chosen = cache.select(queries, budget, window, rescore_candidates=rescore)
    assert len(calls) == layers
    assert all(torch.equal(a, b) for a, b in zip(chosen, reference, strict=True))


# --------------------------------------------------------------------------------------------------------------
# the compiled kernels on a GPU
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernels_match_reference(dtype, monkeypatch):
    """Compiled (not interpreted) kernels at a Llama-3-8B-like layer shape, and the wired cache on CUDA."""
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    q_heads, kv_heads, head_dim, chunk, budget, window = 32, 8, 128, 16, 2048, 128
    length = 16384 + 5  # a trailing partial chunk
    full_k = torch.randn(1, kv_heads, length + 64, head_dim, generator=g, device=device).to(dtype)
    full_v = torch.randn(1, kv_heads, length + 64, head_dim, generator=g, device=device).to(dtype)
    keys, values = full_k[:, :, :length], full_v[:, :, :length]
    summaries = chunk_means(keys, chunk)
    query = torch.randn(1, q_heads, 2, head_dim, generator=g, device=device).to(dtype)[:, :, -1]

    assert kr.triton_enabled(query, summaries)
    scores = kr.score_chunks_triton(query, summaries)
    _assert_scores_close(scores.cpu(), query.cpu(), summaries.cpu())
    assert torch.equal(kr.chunk_scores(query, summaries), scores)  # the dispatch takes the kernel on CUDA
    nominees = nominate_chunks(scores, length, chunk, budget, window, 4)  # rescore_candidates=4
    key_scores = kr.score_chunk_keys_triton(query, keys, nominees, chunk)
    _assert_key_scores_close(key_scores.cpu(), query.cpu(), keys.cpu(), nominees.cpu(), chunk)
    assert torch.equal(kr.chunk_key_scores(query, keys, nominees, chunk), key_scores)

    indices = select_token_indices(scores, length, chunk, budget, window)
    storage_k = torch.zeros(1, kv_heads, budget + 32, head_dim, dtype=dtype, device=device)
    storage_v = torch.zeros_like(storage_k)
    slots = indices.shape[-1]
    kr.gather_kv_into(keys, values, indices, storage_k[:, :, :slots], storage_v[:, :, :slots])
    torch.cuda.synchronize()
    assert torch.equal(_bits(storage_k[:, :, :slots]), _bits(gather_tokens(keys, indices)))
    assert torch.equal(_bits(storage_v[:, :, :slots]), _bits(gather_tokens(values, indices)))
    assert not storage_k[:, :, slots:].any() and not storage_v[:, :, slots:].any()

    # the wired cache: kernel-selected view on CUDA == the same selection gathered by hand
    cache = RetrievalCache(num_layers=1, chunk_size=chunk, capacity=length)
    cache.update(keys, values, 0)
    cache_indices = cache.select([query], budget, window)[0]  # one look-ahead chunk, always
    cache_scores = kr.score_chunks_triton(query, cache.layers[0].summaries())
    assert torch.equal(cache_indices, select_token_indices(cache_scores, length, chunk, budget, window, 1))
    indices = cache_indices
    view = cache.sparse_view([cache_indices], extra_capacity=8)
    assert torch.equal(_bits(view.layers[0].buffer.keys), _bits(gather_tokens(keys, indices)))
    assert torch.equal(_bits(view.layers[0].buffer.values), _bits(gather_tokens(values, indices)))

    monkeypatch.setenv(DISABLE_ENV, "1")  # the escape hatch: back to the torch reference
    assert not kr.triton_enabled(query, summaries)
    assert kr.chunk_scores(query, summaries).dtype == summaries.dtype
