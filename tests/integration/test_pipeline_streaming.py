"""TriForce through ``pipeline("text-generation")`` and through streamers gives exactly the plain text.

No hub is reachable, so the tokenizer is a tiny BPE (vocabulary 256, the tiny models' size) trained
offline on the Python language reference shipped with CPython (``pydoc_data.topics``) and wrapped in
``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import threading
from pydoc_data.topics import topics

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, TextIteratorStreamer, TextStreamer, pipeline
from transformers.generation.streamers import BaseStreamer

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.errors import UnsupportedGenerationError

pytestmark = pytest.mark.integration

# A fixed schedule: every round speculates, so each case's assert_ran holds whatever the machine's timings.
CFG = TriForceConfig(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, adaptive=False)
PROMPTS = [
    topics["assert"][:300],  # ~150 tokens: longer than the retrieval budget
    "The while statement",  # shorter than a chunk
    topics["lambda"][:120],
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=256, special_tokens=["<unk>", "<eos>", "<pad>"], limit_alphabet=120, show_progress=False
    )
    tok.train_from_iterator(list(topics.values())[:60], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    assert len(fast) <= 256
    return fast


@pytest.fixture(scope="module")
def pipe(llama, tokenizer):
    return pipeline("text-generation", model=llama, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def assisted_pipe(llama, llama_draft, tokenizer):
    return pipeline("text-generation", model=llama, tokenizer=tokenizer, assistant_model=llama_draft)


def test_tokenizer_round_trip(tokenizer):
    text = PROMPTS[0]
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


# ---------------------------------------------------------------------------------------------------
# Pipelines


def test_pipeline_batch_size(llama, tokenizer, assert_ran):
    """``pipeline(..., batch_size=4)`` over left-padded batches gives the plain pipeline's text."""
    tokenizer.padding_side = "left"
    try:
        pipe = pipeline("text-generation", model=llama, tokenizer=tokenizer)
        prompts = PROMPTS * 2
        expected = pipe(prompts, max_new_tokens=16, do_sample=False, batch_size=4)
        got = pipe(prompts, max_new_tokens=16, do_sample=False, batch_size=4, triforce_config=CFG)
    finally:
        tokenizer.padding_side = "right"
    assert got == expected
    assert len(hf_triforce.last_stats(llama).rows) == 2  # the last batch: 6 prompts in batches of 4
    assert_ran(llama)


@pytest.mark.parametrize("prompt", PROMPTS, ids=["long", "short", "lambda"])
@pytest.mark.parametrize("drafter", ["none", "ngram", "auto"])
def test_pipeline_same_text(llama, pipe, assert_ran, prompt, drafter):
    cfg = TriForceConfig(**{**CFG.to_dict(), "drafter": drafter})
    expected = pipe(prompt, max_new_tokens=20, do_sample=False)
    got = pipe(prompt, max_new_tokens=20, do_sample=False, triforce_config=cfg)
    assert got == expected
    assert got[0]["generated_text"].startswith(prompt)
    assert hf_triforce.last_stats(llama).new_tokens == 20
    assert_ran(llama)


def test_pipeline_accepts_a_dict_config(llama, pipe, assert_ran):
    expected = pipe(PROMPTS[0], max_new_tokens=12, do_sample=False)
    assert pipe(PROMPTS[0], max_new_tokens=12, do_sample=False, triforce_config=CFG.to_dict()) == expected
    assert_ran(llama, rejected=("level1",))


def test_pipeline_return_full_text_false(llama, pipe, assert_ran):
    kwargs = dict(max_new_tokens=15, do_sample=False, return_full_text=False)
    expected = pipe(PROMPTS[0], **kwargs)
    assert pipe(PROMPTS[0], triforce_config=CFG, **kwargs) == expected
    assert_ran(llama)


def test_pipeline_stop_sequence(llama, pipe, tokenizer, assert_ran):
    """A stop string found in the plain output stops TriForce at the same place."""
    full = pipe(PROMPTS[0], max_new_tokens=30, do_sample=False, return_full_text=False)[0]["generated_text"]
    words = [w for w in full.split() if len(w) >= 2]
    assert words, f"the fixture changed: plain output {full!r} has no stop string to use"
    stop = words[len(words) // 2]
    kwargs = dict(max_new_tokens=30, do_sample=False, return_full_text=False, stop_sequence=stop)
    expected = pipe(PROMPTS[0], **kwargs)
    assert pipe(PROMPTS[0], triforce_config=CFG, **kwargs) == expected
    assert_ran(llama)


def test_batch_stop_strings(llama, tokenizer, forward_counter, assert_ran):
    """A stop string one row reaches: that row stops where plain batched generate() stops it (padded after it, as
    an EOS criterion makes plain generate() pad stopped rows), the others go on. Without an EOS id the batch is
    refused: plain generate() would keep decoding the stopped row."""
    tokenizer.padding_side = "left"
    try:
        batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = "right"
    plain = llama.generate(**batch, max_new_tokens=30, do_sample=False)
    text = tokenizer.decode(plain[0, batch["input_ids"].shape[1] :])
    words = [w for w in text.split() if len(w) >= 2]
    assert words, f"the fixture changed: plain output {text!r} has no stop string to use"
    kwargs = dict(max_new_tokens=30, do_sample=False, stop_strings=[words[len(words) // 2]], tokenizer=tokenizer)
    counter = forward_counter(llama)
    with pytest.raises(UnsupportedGenerationError, match="without an eos_token_id"):
        llama.generate(**batch, triforce_config=CFG, **kwargs)
    counter.remove()
    assert counter.calls == 0
    kwargs.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    expected = llama.generate(**batch, **kwargs)
    assert torch.equal(llama.generate(**batch, triforce_config=CFG, **kwargs), expected)
    rows = hf_triforce.last_stats(llama).rows
    assert min(row.new_tokens for row in rows) < 30
    assert_ran(llama)


def test_generate_stop_strings(llama, tokenizer, assert_ran):
    ids = encode(tokenizer, PROMPTS[1])
    text = tokenizer.decode(llama.generate(ids, max_new_tokens=30, do_sample=False)[0, ids.shape[1] :])
    words = [w for w in text.split() if len(w) >= 2]
    assert words, f"the fixture changed: plain output {text!r} has no stop string to use"
    kwargs = dict(max_new_tokens=30, do_sample=False, stop_strings=[words[len(words) // 2]], tokenizer=tokenizer)
    expected = llama.generate(ids, **kwargs)
    assert expected.shape[1] < ids.shape[1] + 30
    assert torch.equal(llama.generate(ids, triforce_config=CFG, **kwargs), expected)
    assert_ran(llama)


@pytest.mark.parametrize("prompt", PROMPTS[:2], ids=["long", "short"])
@pytest.mark.parametrize("drafter", ["model", "auto"])
def test_pipeline_with_assistant_model(llama, assisted_pipe, pipe, assert_ran, prompt, drafter):
    """``assistant_model`` given to the pipeline constructor becomes TriForce's level-0 drafter."""
    cfg = TriForceConfig(**{**CFG.to_dict(), "drafter": drafter})
    expected = pipe(prompt, max_new_tokens=20, do_sample=False)
    assert assisted_pipe(prompt, max_new_tokens=20, do_sample=False) == expected  # plain assisted decoding
    got = assisted_pipe(prompt, max_new_tokens=20, do_sample=False, triforce_config=cfg)
    assert got == expected
    assert_ran(llama, drafted=("level0", "level1"))  # the pipeline's assistant model drafted for level 1


def test_pipeline_batched_prompts_one_at_a_time(llama, pipe, assert_ran):
    """A list of prompts (batch_size 1, the pipeline default) runs TriForce once per prompt."""
    expected = pipe(PROMPTS, max_new_tokens=10, do_sample=False)
    assert pipe(PROMPTS, max_new_tokens=10, do_sample=False, triforce_config=CFG) == expected
    assert_ran(llama)  # the last prompt's call
    assert not hf_triforce.last_stats(llama).rows  # one sequence, not a batch


# ---------------------------------------------------------------------------------------------------
# Streamers


class RecordingStreamer(BaseStreamer):
    """Records every ``put`` (as lists of ids) and counts ``end`` calls."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        assert self.ended == 0, "put() after end()"
        self.chunks.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended += 1


def encode(tokenizer, text: str) -> torch.LongTensor:
    return tokenizer(text, return_tensors="pt")["input_ids"]


@pytest.mark.parametrize("prompt", PROMPTS[:2], ids=["long", "short"])
@pytest.mark.parametrize("skip_prompt", [False, True])
def test_text_streamer_same_output(llama, tokenizer, capsys, assert_ran, prompt, skip_prompt):
    ids = encode(tokenizer, prompt)
    outputs = []
    for cfg in (None, CFG):
        streamer = TextStreamer(tokenizer, skip_prompt=skip_prompt)
        extra = {} if cfg is None else {"triforce_config": cfg}
        out = llama.generate(ids, max_new_tokens=25, do_sample=False, streamer=streamer, **extra)
        outputs.append((out, capsys.readouterr().out))
    (plain_ids, plain_text), (tri_ids, tri_text) = outputs
    assert torch.equal(plain_ids, tri_ids)
    assert_ran(llama)
    assert tri_text == plain_text
    new_text = tokenizer.decode(plain_ids[0, ids.shape[1] :])
    assert new_text.strip() in plain_text


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_text_iterator_streamer_same_output(llama, llama_draft, tokenizer, assert_ran, drafter):
    ids = encode(tokenizer, PROMPTS[0])

    def stream(**kwargs) -> tuple[str, list[str]]:
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=60)
        kwargs = dict(max_new_tokens=30, do_sample=False, streamer=streamer, **kwargs)
        thread = threading.Thread(target=llama.generate, args=(ids,), kwargs=kwargs)
        thread.start()
        pieces = list(streamer)
        thread.join()
        return "".join(pieces), pieces

    plain_text, _ = stream()
    cfg = TriForceConfig(**{**CFG.to_dict(), "drafter": drafter, "gamma2": 8})
    tri_text, _ = stream(triforce_config=cfg, assistant_model=llama_draft if drafter == "model" else None)
    assert tri_text == plain_text
    assert tri_text  # something was generated
    assert_ran(llama, drafted=("level0", "level1"))


@pytest.mark.parametrize("setting", ["sparse_ngram", "self_draft_full_acceptance"])
def test_streamer_receives_exactly_the_new_tokens(llama, tokenizer, self_draft_config, assert_ran, setting):
    """The prompt first, then every new token once, in order, then one ``end()`` — as with plain generate()."""
    cfg, assistant = (CFG, None) if setting == "sparse_ngram" else (self_draft_config(256), "self")
    ids = encode(tokenizer, PROMPTS[0])
    plain, tri = RecordingStreamer(), RecordingStreamer()
    expected = llama.generate(ids, max_new_tokens=21, do_sample=False, streamer=plain)
    got = llama.generate(
        ids,
        max_new_tokens=21,
        do_sample=False,
        streamer=tri,
        triforce_config=cfg,
        assistant_model=llama if assistant == "self" else None,
    )
    assert torch.equal(expected, got)
    assert tri.ended == plain.ended == 1
    assert tri.chunks[0] == plain.chunks[0] == ids[0].tolist()
    streamed = [t for chunk in tri.chunks[1:] for t in chunk]
    assert streamed == got[0, ids.shape[1] :].tolist()
    if setting == "sparse_ngram":
        assert_ran(llama, rejected=("level1",))  # rejected drafts never reach the streamer
    else:
        assert_ran(llama, drafted=("level0", "level1"), full_rounds=True)  # whole accepted runs stream at once


def test_streamer_stops_at_eos(llama, tokenizer, self_draft_config, assert_ran):
    """With an EOS mid-way (inside an accepted draft), the streamer gets the same tokens up to EOS."""
    ids = encode(tokenizer, PROMPTS[1])
    reference = llama.generate(ids, max_new_tokens=30, do_sample=False)[0, ids.shape[1] :].tolist()
    eos = next((t for i, t in enumerate(reference) if i >= 6 and t not in reference[:i]), None)
    assert eos is not None, f"the fixture changed: no fresh token from new token 6 of {reference} to use as EOS"
    cfg = self_draft_config(128)
    plain, tri = RecordingStreamer(), RecordingStreamer()
    expected = llama.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=eos, streamer=plain)
    got = llama.generate(
        ids,
        max_new_tokens=30,
        do_sample=False,
        eos_token_id=eos,
        streamer=tri,
        triforce_config=cfg,
        assistant_model=llama,
    )
    assert torch.equal(expected, got)
    assert int(got[0, -1]) == eos
    flat = [t for chunk in tri.chunks[1:] for t in chunk]
    assert flat == [t for chunk in plain.chunks[1:] for t in chunk]
    assert_ran(llama, drafted=("level0", "level1"), accepted=("level1",))
