"""CUDA graphs for the level-1/level-0 steps, and bfloat16 losslessness on CUDA (``gpu``: skipped without CUDA).

Their CPU reference is ``tests/integration/test_static_view.py`` / ``test_static_steps.py`` (the same static
steps, run eagerly). Here, on a GPU: a replayed graph gives exactly the eager static step's logits (same
kernels, same buffers) through crops, syncs and an in-place re-selection; ``cuda_graphs`` True / "eager" /
False give identical greedy output; and TriForce in bfloat16 matches plain ``generate()``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.bench.divergence import first_divergence
from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.caches.static_view import StaticRetrievalView
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.hierarchy import static_steps

pytestmark = [
    pytest.mark.integration,
    pytest.mark.gpu,
]

SMALL = dict(
    chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, adaptive=False
)  # same drafts on both paths
CUDA = torch.device("cuda")


def _on_cuda(model_factory, family: str = "llama_gqa", dtype=torch.float32, **kwargs):
    return model_factory(family, **kwargs).to(CUDA, dtype)


def _selection(length: int, selected: int, kv_heads: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(length, generator=gen)[:selected].sort().values for _ in range(kv_heads)]
    return torch.stack(rows)[None].to(CUDA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager_static_step(model_factory, dtype):
    model = _on_cuda(model_factory, dtype=dtype)
    layers, kv_heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    tokens = torch.randint(0, model.config.vocab_size, (160,), generator=torch.Generator().manual_seed(0)).to(CUDA)
    source = RetrievalCache(layers, chunk_size=8, capacity=256)
    views = [StaticRetrievalView(source, capacity=80) for _ in range(2)]
    eager = static_steps.StaticStepRunner(model, views[0], range(1, 4), use_graphs=False)
    graphed = static_steps.StaticStepRunner(model, views[1], range(1, 4), use_graphs=True, strict=True)
    with torch.no_grad():
        model(input_ids=tokens[None, :100], **cache_kwargs(source), use_cache=True)
        for view in views:
            view.refresh([_selection(100, 48, kv_heads, seed=s) for s in range(layers)])
        position, cursor = 100, 100
        plan = [(3, 1), (1, 1), (2, 2), (3, 3), "sync", (3, 2), (1, 1), "refresh", (2, 1), (3, 3), (1, 1)]
        for item in plan:
            if item == "sync":
                model(input_ids=tokens[None, cursor : cursor + 5], **cache_kwargs(source), use_cache=True)
                cursor, position = cursor + 5, source.get_seq_length()
                for view in views:
                    view.sync()
                continue
            if item == "refresh":
                indices = [_selection(source.get_seq_length(), 48, kv_heads, seed=20 + s) for s in range(layers)]
                for view in views:
                    view.refresh(indices)
                position = source.get_seq_length()
                continue
            width, keep = item
            step = tokens[cursor : cursor + width]
            expected, got = eager.step(step, position), graphed.step(step, position)
            assert torch.equal(got, expected), f"width {width}: max diff {(got - expected).abs().max():.3g}"
            for view in views:
                view.crop(-(width - keep))
            cursor, position = cursor + width, position + keep
    assert graphed.counts["capture"] == 3 and graphed.counts["replay"] == 9 and graphed.counts["eager"] == 0


@pytest.mark.parametrize("drafter", ["none", "model"])
def test_graphs_on_and_off_give_identical_greedy_output(model_factory, make_prompt, runners, drafter):
    model = _on_cuda(model_factory)
    assistant = _on_cuda(model_factory, num_layers=1, seed=101, enable=False) if drafter == "model" else None
    prompt = make_prompt(200, seed=3).to(CUDA)
    kwargs = dict(max_new_tokens=48, do_sample=False, assistant_model=assistant)
    logits = dict(return_dict_in_generate=True, output_logits=True)
    plain = model.generate(prompt, max_new_tokens=48, do_sample=False)
    outputs, levels, verified = {}, {}, {}
    for mode in (True, "eager", False):
        cfg = TriForceConfig(**SMALL, drafter=drafter, cuda_graphs=mode, draft_cache_budget=40)
        out = model.generate(prompt, triforce_config=cfg, **kwargs, **logits)
        outputs[mode], verified[mode] = out.sequences, torch.cat(out.logits)
        stats = hf_triforce.last_stats(model)
        levels[mode] = stats.to_dict()["levels"]
        assert torch.equal(outputs[mode], plain), f"cuda_graphs={mode!r} differs from plain generate()"
        assert levels[mode]["level1"]["drafted"] > 0, levels[mode]
    # Replay and eager static steps run the same kernels on the same buffers: the same drafts, and the very same
    # verification logits (the verification runs dynamic shapes either way).
    assert levels[True] == levels["eager"]
    assert torch.equal(verified[True], verified["eager"])
    graphed = [r for r in runners if r.use_graphs]
    assert graphed and all(r.counts["replay"] > 0 for r in graphed)
    assert len(graphed) == (2 if drafter == "model" else 1)


@pytest.mark.parametrize("drafter", ["none", "model"])
def test_bfloat16_greedy_equals_plain_generate(model_factory, make_prompt, drafter):
    """TriForce greedy output in bfloat16 on CUDA equals plain ``generate()`` (random-weights Llama, GQA).

    Where bf16 can make the two differ, and how this test accounts for it:

    * Plain ``generate()`` computes each token's logits in a one-token forward; TriForce's full-cache
      verification computes ``gamma2 + 1`` positions in one multi-token forward. The logits of a position
      are the same function of the same weights and KV cache, but not the same kernels: cuBLAS picks
      GEMV/GEMM kernels and split-K reductions by the number of rows, and the attention differs too (SDPA's
      flash kernel for one unmasked query in decode; hf_triforce's split-KV Triton kernel, or SDPA's
      memory-efficient one without Triton, for the verification), so the float32 accumulations happen in
      different orders. After rounding to bf16 (8 bits of mantissa) at
      every layer boundary, the logits of the two paths differ in the last bits (the test reports the
      size), and so does the KV cache the two paths write.
    * Greedy output can only change where the top-2 logits are closer than that noise. The test
      disables cuBLAS's reduced-precision bf16 reductions (``allow_bf16_reduced_precision_reduction``),
      uses a model whose logits are well separated (``initializer_range`` 0.15, see the integration
      conftest), and requires identical token ids. If they differ, it passes only when the first
      differing position is a near-tie by :func:`hf_triforce.bench.divergence.first_divergence`:
      both paths' top-2 gaps there are at most twice the largest logits difference the two paths had over
      the positions before it, where they agreed, and at most ``NEAR_TIE_ULPS`` (16) bf16 units in the last
      place at those logits (``gap_cap``; a warning names the position). Any other difference fails.
      Everything before that position must be identical.

    Level 0 and level 1 only draft: their bf16 numerics (static steps, CUDA graphs) change acceptance,
    never the output, because the full-cache verification decides every token.
    """
    model = _on_cuda(model_factory, dtype=torch.bfloat16)
    assistant = None
    if drafter == "model":
        assistant = _on_cuda(model_factory, dtype=torch.bfloat16, num_layers=1, seed=101, enable=False)
    prompt = make_prompt(300, seed=11).to(CUDA)
    common = dict(max_new_tokens=64, do_sample=False, return_dict_in_generate=True, output_logits=True)
    previous = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    try:
        plain = model.generate(prompt, **common)
        cfg = TriForceConfig(**SMALL, drafter=drafter, cuda_graphs="auto")
        ours = model.generate(prompt, triforce_config=cfg, assistant_model=assistant, **common)
    finally:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = previous
    found = first_divergence(
        prompt.shape[1], plain.sequences, ours.sequences, plain.logits, ours.logits, dtype=model.dtype
    )
    assert plain.sequences.shape == ours.sequences.shape
    if found is None:
        return
    assert found.near_tie, (
        f"bf16 output differs from plain generate() at new token {found.new_token} (tokens {found.plain_token} vs "
        f"{found.triforce_token}); top-2 gaps {found.gaps} are not explained by the logits noise "
        f"{found.logits_noise:.3g} between one-token and multi-token forwards, or exceed the bf16 cap "
        f"{found.gap_cap:.3g}"
    )
    warnings.warn(
        f"bf16 near-tie at new token {found.new_token}: plain picks {found.plain_token}, TriForce "
        f"{found.triforce_token}; gaps {found.gaps}, logits noise {found.logits_noise:.3g}, cap {found.gap_cap:.3g}",
        stacklevel=1,
    )
