"""Batched TriForce: every row equals plain batched ``generate()`` on the same left-padded batch.

Rows have prompts of different lengths (left padding), accept different numbers of tokens per round, and stop at
different points; each row must come out exactly as plain batched greedy ``generate()`` makes it, and (float32)
as that row generated alone. The sampling side (rows distributed like plain sampling, per prompt) is in
``test_sampling_paths.py``. The schedule is fixed (``adaptive=False``), and every case asserts from the call's
statistics that the levels it names drafted (and level 1 rejected, where the views are sparse).
"""

from __future__ import annotations

import pytest
import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.errors import UnsupportedDeviceError, UnsupportedGenerationError

pytestmark = pytest.mark.integration

SPARSE = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=3, gamma1=2, gamma2=4, adaptive=False)
LENGTHS = [300, 221, 257, 180, 333, 96, 140, 275]


def left_padded(lengths: list[int], repeat: bool = False, vocab: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B, P], [B, P])`` left-padded random prompts (pad id 0) and their mask; ``repeat``: each prompt is a
    short random phrase repeated, which level 0 and level 1 draft well."""
    longest = max(lengths)
    ids = torch.zeros(len(lengths), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        generator = torch.Generator().manual_seed(b)
        tokens = torch.randint(1, vocab, (17 if repeat else n,), generator=generator)
        ids[b, longest - n :] = tokens.repeat(n // tokens.shape[0] + 1)[:n]
        mask[b, longest - n :] = 1
    return ids, mask


def check_rows(expected: torch.Tensor, got: torch.Tensor) -> None:
    assert got.shape == expected.shape, (got.shape, expected.shape)
    for b in range(expected.shape[0]):
        first = (expected[b] != got[b]).nonzero()
        assert not first.numel(), f"row {b} differs from position {int(first[0, 0])}"


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_greedy_batch_equals_plain_batched_generate(model_factory, assert_ran, batch, drafter):
    model = model_factory("llama_gqa", num_layers=2)
    ids, mask = left_padded(LENGTHS[:batch] if batch > 1 else [200, 300][:1], repeat=drafter == "ngram")
    if batch == 1:  # one row with left padding also takes the batched path
        ids, mask = torch.cat([ids.new_zeros(1, 13), ids], 1), torch.cat([mask.new_zeros(1, 13), mask], 1)
    kwargs = dict(attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    got = model.generate(ids, triforce_config=TriForceConfig(drafter=drafter, **SPARSE), **kwargs)
    check_rows(expected, got)
    stats = hf_triforce.last_stats(model)
    assert len(stats.rows) == batch
    assert [row.new_tokens for row in stats.rows] == [40] * batch
    levels = ("level1",) if drafter == "none" else ("level0", "level1")
    for row in stats.rows:  # every row speculated, and its sparse view was rejected somewhere
        assert_ran(row, drafted=levels, rejected=("level1",))


@pytest.mark.parametrize("family", ["llama_mha", "qwen2", "qwen3", "mistral"])
def test_greedy_batch_other_families_and_rows_alone(model_factory, assert_ran, family):
    """Each row also equals that row generated alone (float32), in every supported family (with the selection's
    rescoring on, whose nominations must skip each row's padding chunks)."""
    model = model_factory(family, num_layers=2)
    ids, mask = left_padded([260, 150, 201])
    cfg = TriForceConfig(drafter="ngram", rescore_candidates=2, **SPARSE)
    got = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0,
                         triforce_config=cfg)  # fmt: skip
    check_rows(model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0), got)
    assert_ran(model, drafted=("level0", "level1"), rejected=("level1",))
    for b in range(ids.shape[0]):
        alone = ids[b : b + 1, mask[b].bool()]
        expected = model.generate(alone, max_new_tokens=30, do_sample=False)
        assert torch.equal(got[b, -30:], expected[0, -30:]), f"row {b} differs from the row generated alone"


def test_greedy_batch_with_a_draft_model(model_factory, assert_ran):
    """drafter="model": each row drafts with its own StreamingLLM cache of the draft model."""
    model = model_factory("llama_gqa", num_layers=2)
    draft = model_factory("llama_gqa", num_layers=1, seed=3, enable=False)
    ids, mask = left_padded([200, 120, 260])
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    cfg = TriForceConfig(drafter="model", draft_cache_budget=48, **SPARSE)
    got = model.generate(ids, assistant_model=draft, triforce_config=cfg, **kwargs)
    check_rows(model.generate(ids, **kwargs), got)
    stats = hf_triforce.last_stats(model)
    assert stats.level0.drafted > 0 and stats.draft_cache_bytes > 0
    for row in stats.rows:
        assert_ran(row, drafted=("level0", "level1"), rejected=("level0", "level1"))


def test_rows_stop_where_plain_generate_stops_them(model_factory, assert_ran):
    """With an EOS id that rows reach at different steps, each row ends where plain batched generate() ends it,
    padded after it; a finished row leaves the batch (its forwards stop counting)."""
    model = model_factory("llama_gqa", num_layers=2)
    ids, mask = left_padded([240, 180, 300, 120])
    kwargs = dict(attention_mask=mask, max_new_tokens=60, do_sample=False, pad_token_id=0)
    reference = model.generate(ids, **kwargs)
    new = reference[:, ids.shape[1] :]
    eos = int(new[1, 9])  # row 1 produces it at step 10 (or earlier); other rows later or never
    expected = model.generate(ids, eos_token_id=eos, **kwargs)
    got = model.generate(ids, eos_token_id=eos, triforce_config=TriForceConfig(drafter="ngram", **SPARSE), **kwargs)
    check_rows(expected, got)
    stats = hf_triforce.last_stats(model)
    lengths = [row.new_tokens for row in stats.rows]
    assert min(lengths) < max(lengths), lengths
    for row in stats.rows:  # a row takes part in no verification after its last token
        assert row.target_forwards <= row.new_tokens - 1
    assert stats.target_forwards == max(row.target_forwards for row in stats.rows)
    assert_ran(stats, drafted=("level1",), rejected=("level1",))


def test_ragged_acceptance_keeps_every_row_s_tokens(model_factory, assert_ran):
    """A row whose retrieval view holds all of its tokens (level 1 is then level 2, every draft is accepted) beside
    rows with sparse views that accept few: the first keeps its full runs of ``gamma2 + 1`` tokens per
    verification (it is not cut to the batch's shortest), and every row keeps every token it accepted (decoded
    tokens = new tokens - the first, which the prefill makes)."""
    model = model_factory("llama_gqa", num_layers=2)
    ids, mask = left_padded([40, 300, 260])
    cfg = TriForceConfig(drafter="none", **{**SPARSE, "retrieval_budget": 128})
    kwargs = dict(attention_mask=mask, max_new_tokens=48, do_sample=False, pad_token_id=0)
    got = model.generate(ids, triforce_config=cfg, **kwargs)
    check_rows(model.generate(ids, **kwargs), got)
    rows = hf_triforce.last_stats(model).rows
    lengths = [row.mean_accepted_length for row in rows]
    assert lengths[0] > 4 and lengths[0] > 1.5 * max(lengths[1:]), lengths
    for row in rows:
        assert row.decoded_tokens == row.new_tokens - 1
    assert_ran(rows[0], full_rounds=True)
    for row in rows[1:]:
        assert_ran(row, rejected=("level1",))


def test_num_return_sequences_and_sampling_shapes(model_factory, assert_ran):
    model = model_factory("llama_gqa", num_layers=2)
    ids, mask = left_padded([150, 90])
    torch.manual_seed(0)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=True, num_return_sequences=3,
                         pad_token_id=0, triforce_config=TriForceConfig(**SPARSE))  # fmt: skip
    assert out.shape == (6, ids.shape[1] + 12)
    assert torch.equal(out[:, : ids.shape[1]], ids.repeat_interleave(3, dim=0))
    assert len(hf_triforce.last_stats(model).rows) == 6
    assert_ran(model, drafted=("level0", "level1"), rejected=("level1",))


def halves(batch_id: int, ids: torch.Tensor) -> list[int]:
    """A ``prefix_allowed_tokens_fn`` that depends on the batch index: even rows draw from ids 0-127, odd rows
    from 128-255."""
    return list(range(128)) if batch_id % 2 == 0 else list(range(128, 256))


def test_prefix_allowed_tokens_fn_gets_each_row_s_batch_index(model_factory, assert_ran):
    """A row judged on its own still passes its own batch index to ``prefix_allowed_tokens_fn``, as plain batched
    ``generate()`` does (given 0 for every row, odd rows would be constrained to the wrong half)."""
    model = model_factory("llama_gqa", num_layers=2)
    ids, mask = left_padded([150, 90, 120])
    kwargs = dict(attention_mask=mask, max_new_tokens=16, pad_token_id=0, prefix_allowed_tokens_fn=halves)
    expected = model.generate(ids, do_sample=False, **kwargs)
    check_rows(expected, model.generate(ids, do_sample=False, triforce_config=TriForceConfig(**SPARSE), **kwargs))
    assert_ran(model, rejected=("level1",))
    # Sampled, with num_return_sequences: each row must get the half plain generate() gives it (the index of the
    # prompt from transformers 5.24, of the expanded row before).
    sampled = dict(kwargs, do_sample=True, num_return_sequences=2)
    plain_low = (model.generate(ids, **sampled)[:, ids.shape[1] :] < 128).all(dim=1)
    new = model.generate(ids, triforce_config=TriForceConfig(**SPARSE), **sampled)[:, ids.shape[1] :]
    assert torch.equal(plain_low, (new < 128).all(dim=1)) and bool(((new < 128).all(1) | (new >= 128).all(1)).all())
    assert_ran(model, rejected=("level1",))


@pytest.mark.parametrize(
    "change, message, error",
    [
        (dict(right_padding=True), "a row whose last token is padding", UnsupportedGenerationError),
        (dict(output_scores=True, return_dict_in_generate=True), "output_scores", UnsupportedGenerationError),
        (
            dict(drafter="model", cuda_graphs=True),
            r"cuda_graphs=True\) .* on cpu",
            UnsupportedDeviceError,
        ),  # a CPU model
    ],
)
def test_batch_refusals(model_factory, forward_counter, change, message, error):
    """What a batch cannot serve raises before any work (no forward of either model), saying what to change: the
    batch's own refusals, and the refusal a single sequence gets too (CUDA graphs asked for on the CPU)."""
    model = model_factory("llama_gqa", num_layers=2)
    draft = model_factory("llama_gqa", num_layers=1, seed=3, enable=False)
    ids, mask = left_padded([120, 80])
    if change.pop("right_padding", False):
        ids, mask = ids.flip(1), mask.flip(1)
    cfg = TriForceConfig(**{**SPARSE, **{k: change.pop(k) for k in ("drafter", "cuda_graphs") if k in change}})
    assistant = {"assistant_model": draft} if cfg.drafter == "model" else {}
    counter = forward_counter(model, draft)
    with pytest.raises(error, match=message.replace("(", r"\(")):
        model.generate(ids, attention_mask=mask, max_new_tokens=5, pad_token_id=0, triforce_config=cfg, **assistant,
                       **change)  # fmt: skip
    counter.remove()
    assert counter.calls == 0
