"""``hf-triforce eval-drafts`` on tiny random models: the acceptance measure, the views, the needle, the CLI.

The measure must be exact where the answer is known (a budget that holds the whole sequence accepts
everything; the batched level-1 forward equals a one-token forward over a ``RetrievalView``; the
StreamingLLM view equals attention over ``cat(sinks, window)``), the needle must sit at the requested
token depth, and the CLI must run end to end on a saved model and write its JSON, markdown and PNG.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hf_triforce.caches.view import RetrievalView
from hf_triforce.cli import main
from hf_triforce.errors import TriForceConfigError
from hf_triforce.evaluation.drafts.acceptance import acceptance, processed_probs, token_acceptance
from hf_triforce.evaluation.drafts.level0 import measure_drafter
from hf_triforce.evaluation.drafts.level1 import measure_view, replay_round
from hf_triforce.evaluation.drafts.needle import (
    DEFAULT_NEEDLE,
    DEFAULT_NEEDLE_REQUEST,
    build_needle_prompt,
    needle_overlap,
)
from hf_triforce.evaluation.drafts.reference import decode_reference, prefill_prompt
from hf_triforce.evaluation.drafts.streaming_view import streaming_indices
from hf_triforce.evaluation.drafts.summary import pooled
from hf_triforce.evaluation.drafts.view_forward import row_mask, view_logits
from hf_triforce.evaluation.drafts.view_policy import ViewPolicy, attention_mass, group_scores, select_indices
from hf_triforce.hf.model import truncated_model
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.hierarchy import NGramDrafter
from hf_triforce.kernels.retrieval import score_chunks

# TriForceConfig fields deprecated in 0.2 (removed in 0.3) that these tests still exercise
pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:lookahead_chunks:FutureWarning"),
    pytest.mark.filterwarnings("ignore:refresh_below_acceptance:FutureWarning"),
    pytest.mark.filterwarnings("ignore:step_selection:FutureWarning"),
]

PROMPT = 160
NEW = 12


@pytest.fixture(scope="module")
def prefilled(llama, make_prompt):
    """The tiny GQA Llama with a prefilled prompt: ``(model, cache, prefill)``."""
    cache, prefill = prefill_prompt(llama, make_prompt(PROMPT, seed=3), capacity=PROMPT + NEW + 8)
    return llama, cache, prefill


def _reference(prefilled, temperature: float, seed: int = 0):
    model, cache, prefill = prefilled
    cache.crop(-(cache.get_seq_length() - PROMPT))
    generator = torch.Generator().manual_seed(seed)
    return model, cache, decode_reference(model, cache, prefill, NEW, temperature, generator=generator)


def test_reference_matches_plain_greedy_generate(prefilled, make_prompt):
    model, cache, ref = _reference(prefilled, 0.0)
    expected = model.generate(make_prompt(PROMPT, seed=3), max_new_tokens=NEW, do_sample=False)
    assert torch.equal(ref.sequence(), expected[0])
    assert cache.get_seq_length() == PROMPT + NEW - 1
    assert ref.logits.shape == (NEW, model.config.vocab_size)
    assert ref.queries.shape == (2, NEW, 4, 16)  # layers, positions, query heads, head_dim


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["retrieval", "streaming"])
def test_acceptance_is_one_when_the_budget_holds_the_whole_sequence(prefilled, temperature, kind):
    model, cache, ref = _reference(prefilled, temperature, seed=1)
    policy = ViewPolicy(kind=kind, budget=512, refresh_every=4)
    m = measure_view(model, cache, ref, policy, gamma2=3)
    assert m.acceptance.shape == (NEW - 1,)
    if temperature == 0:
        assert m.acceptance.tolist() == [1.0] * (NEW - 1)
    else:
        assert float(m.acceptance.min()) > 1 - 1e-4, m.acceptance
    # every round accepts its 3 drafts and the full cache adds one: rounds start at 1, 5, 9, each re-selects
    assert m.refreshes == len(range(1, NEW, 4)) and m.accepted == m.drafted


def test_small_budget_loses_acceptance(prefilled):
    model, cache, ref = _reference(prefilled, 1.0, seed=2)
    m = measure_view(model, cache, ref, ViewPolicy(budget=32, chunk_size=8, recent_window=8, refresh_every=5))
    assert m.acceptance.shape == (NEW - 1,) and float(m.acceptance.mean()) < 0.999
    assert 1 <= m.refreshes <= NEW - 1 and 0 <= m.accepted <= m.drafted
    assert 32 - 8 < m.view_tokens <= 32 + 5 + 6  # a partial chunk costs < chunk_size; tail < stride + a round


def test_rounds_are_replayed_like_the_generator():
    coins = torch.Generator().manual_seed(0)
    greedy = replay_round(torch.tensor([1.0, 0.0, 1.0, 1.0]), 3, 0.0, coins)
    assert (greedy.keep, greedy.accepted, greedy.drafted) == (2, 1, 3)  # the rejected position is kept
    full = replay_round(torch.tensor([1.0, 1.0, 1.0, 0.0]), 3, 0.0, coins)
    assert (full.keep, full.accepted, full.drafted) == (4, 3, 3)  # all accepted: the bonus position too
    end = replay_round(torch.tensor([1.0, 1.0]), 3, 0.0, coins)
    assert (end.keep, end.accepted, end.drafted) == (2, 2, 2)
    sampled = [replay_round(torch.tensor([0.5]), 1, 1.0, coins).accepted for _ in range(2000)]
    assert 0.45 < sum(sampled) / 2000 < 0.55


def test_batched_view_logits_equal_one_token_forwards_over_a_retrieval_view(prefilled):
    model, cache, ref = _reference(prefilled, 0.0)
    selected_at = PROMPT
    selection = select_indices(cache, ref.query(0), selected_at, ViewPolicy(budget=48, recent_window=16))
    lengths = torch.arange(PROMPT, PROMPT + NEW - 1)
    batched = view_logits(model, cache, selection, selected_at, lengths, ref.tokens[:-1], max_rows=4)
    for i, length in enumerate(lengths.tolist()):
        tail = torch.arange(selected_at, length)
        indices = [torch.cat([idx, tail.expand(1, idx.shape[1], -1)], dim=-1) for idx in selection]
        view = RetrievalView(cache, indices, extra_capacity=1)
        with torch.no_grad():
            out = model(
                input_ids=ref.tokens[i : i + 1][None],
                position_ids=torch.tensor([[length]]),
                **cache_kwargs(view),
                use_cache=True,
            )
        torch.testing.assert_close(batched[i], out.logits[0, -1].float(), atol=1e-4, rtol=1e-4)


def test_streaming_view_equals_attention_over_sinks_and_window_by_hand(prefilled):
    model, cache, ref = _reference(prefilled, 0.0)
    length, budget, sinks = PROMPT + 3, 40, 4
    idx = streaming_indices(length, budget, sinks, kv_heads=2)
    assert idx[0, 0].tolist() == [*range(sinks), *range(length - (budget - sinks), length)]
    by_hand = DynamicCache()
    for layer_idx, layer in enumerate(cache.layers):
        keys, values = layer.buffer.keys, layer.buffer.values
        window = slice(length - (budget - sinks), length)
        by_hand.update(
            torch.cat([keys[:, :, :sinks], keys[:, :, window]], dim=-2),
            torch.cat([values[:, :, :sinks], values[:, :, window]], dim=-2),
            layer_idx,
        )
    with torch.no_grad():
        expected = model(
            input_ids=ref.tokens[3:4][None], position_ids=torch.tensor([[length]]), **cache_kwargs(by_hand)
        ).logits[0, -1]
    policy = ViewPolicy(kind="streaming", budget=budget, sinks=sinks)
    selection = select_indices(cache, ref.query(3), length, policy)
    got = view_logits(model, cache, selection, length, torch.tensor([length]), ref.tokens[3:4])
    torch.testing.assert_close(got[0], expected.float(), atol=1e-4, rtol=1e-4)


def test_speculative_acceptance_formula():
    gen = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(5, 11, generator=gen), torch.randn(5, 11, generator=gen)
    p, q = processed_probs(p_logits, 0.7), processed_probs(q_logits, 0.7)
    expected = 1 - 0.5 * (p - q).abs().sum(-1)  # 1 - total variation
    torch.testing.assert_close(acceptance(p_logits, q_logits, 0.7), expected)
    by_definition = (q * torch.clamp(p / q, max=1.0)).sum(-1)  # E_{x~q} min(1, p(x)/q(x))
    torch.testing.assert_close(acceptance(p_logits, q_logits, 0.7), by_definition)
    agree = (p_logits.argmax(-1) == q_logits.argmax(-1)).float()
    assert torch.equal(acceptance(p_logits, q_logits, 0.0), agree)
    tokens = q_logits.argmax(-1)
    torch.testing.assert_close(token_acceptance(p_logits, tokens, 0.7), p.gather(1, tokens[:, None])[:, 0])


def test_group_scores_combine_the_heads_of_each_kv_group():
    gen = torch.Generator().manual_seed(0)
    query, summaries = torch.randn(1, 6, 8, generator=gen), torch.randn(1, 2, 5, 8, generator=gen)
    per_head = torch.stack([summaries[0, h // 3] @ query[0, h] for h in range(6)])  # [H_q, C]
    torch.testing.assert_close(group_scores(query, summaries, "sum"), score_chunks(query, summaries))
    torch.testing.assert_close(group_scores(query, summaries, "sum")[0], per_head.view(2, 3, 5).sum(1))
    torch.testing.assert_close(group_scores(query, summaries, "max")[0], per_head.view(2, 3, 5).amax(1))
    soft = (per_head / math.sqrt(8)).softmax(-1).view(2, 3, 5).sum(1)
    torch.testing.assert_close(group_scores(query, summaries, "softmax")[0], soft)


def test_attention_mass_is_the_full_attention_summed_per_chunk():
    gen = torch.Generator().manual_seed(1)
    query, keys = torch.randn(1, 6, 8, generator=gen), torch.randn(1, 2, 43, 8, generator=gen)
    by_hand = torch.zeros(2, 5)
    for h in range(6):  # query head h reads KV head h // 3; the trailing 3 keys (a partial chunk) are left out
        weights = (keys[0, h // 3, :40] @ query[0, h] / math.sqrt(8)).softmax(-1)
        by_hand[h // 3] += weights.view(5, 8).sum(-1)
    torch.testing.assert_close(attention_mass(query, keys, 8)[0], by_hand)
    with pytest.raises(TriForceConfigError, match="attention_mass"):
        group_scores(query, keys[:, :, :5], "attention")


def test_row_mask_shows_each_row_its_prefix_and_itself():
    mask = row_mask(torch.tensor([2, 3, 3]), shared=3, dtype=torch.float32)[0, 0] == 0
    assert mask.int().tolist() == [[1, 1, 0, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 1]]


def test_truncated_model_is_the_first_layers_norm_and_head(llama, make_prompt):
    draft = truncated_model(llama, 1)
    ids = make_prompt(20, seed=5)
    with torch.no_grad():
        hidden = llama(input_ids=ids, output_hidden_states=True).hidden_states[1]
        expected = llama.lm_head(llama.model.norm(hidden))
        got = draft(input_ids=ids).logits
    torch.testing.assert_close(got, expected)
    assert draft.lm_head.weight is llama.lm_head.weight and draft.config.num_hidden_layers == 1


def test_ngram_drafter_measure_counts_proposals(prefilled):
    _, _, ref = _reference(prefilled, 0.0)
    m = measure_drafter(NGramDrafter(3, 1), ref, ref.logits[1:])
    assert m.positions == NEW - 1 and 0 <= m.coverage <= 1
    assert m.proposals == round(m.coverage * m.positions)


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(dict.fromkeys(["[UNK]", "<eos>", "<user>", "<bot>", "Question:", *words]))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<eos>")
    tokenizer.chat_template = (
        "{% for m in messages %}<user> {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}<bot> {% endif %}"
    )
    return tokenizer


DOC_WORDS = "the a of to and is in it with context manager method enter exit statement value python".split()


@pytest.fixture(scope="module")
def document_text() -> str:
    gen = torch.Generator().manual_seed(0)
    return " ".join(DOC_WORDS[i] for i in torch.randint(0, len(DOC_WORDS), (4000,), generator=gen))


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(DOC_WORDS + (DEFAULT_NEEDLE + " " + DEFAULT_NEEDLE_REQUEST).split())


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_needle_sits_at_the_requested_token_depth(tokenizer, document_text, depth):
    prompt = build_needle_prompt(tokenizer, document_text, context_tokens=600, depth=depth)
    start, end = prompt.needle_span
    doc_start, doc_end = prompt.document_span
    doc_tokens = (doc_end - doc_start) - (end - start)
    assert prompt.input_ids.shape[1] <= 600
    assert abs((start - doc_start) - depth * doc_tokens) <= 1
    assert tokenizer.decode(prompt.input_ids[0, start:end]) == DEFAULT_NEEDLE
    cue = " ".join(DEFAULT_NEEDLE.split()[:8])
    assert tokenizer.decode(prompt.input_ids[0, -8:]) == cue, "the answer's cue ends the prompt"
    assert needle_overlap(prompt.needle_ids[8:20], prompt.needle_ids) == 1.0


def test_needle_errors_are_value_errors(tokenizer, document_text):
    with pytest.raises(ValueError, match="outside"):
        build_needle_prompt(tokenizer, document_text, 600, depth=1.5)
    with pytest.raises(ValueError, match="raise the context"):
        build_needle_prompt(tokenizer, document_text, 30, depth=0.5)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, tokenizer, document_text):
    path = tmp_path_factory.mktemp("tiny-eval-model")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        initializer_range=0.15, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    doc = path / "doc.txt"
    doc.write_text(document_text, encoding="utf-8")
    return str(path), str(doc)


def test_eval_drafts_cli_end_to_end(capsys, tmp_path, saved_model):
    model_dir, doc = saved_model
    out = tmp_path / "results" / "eval.json"
    argv = ["eval-drafts", "--model", model_dir, "--document", doc, "--context-tokens", "400", "--new-tokens", "10"]
    argv += ["--budgets", "1/8,1/4", "--headline-budget", "1/4", "--temperatures", "0,1", "--natural-prompts", "1"]
    argv += ["--needle-depths", "0.5", "--draft-layers", "1", "--e2e-context-tokens", "300", "--e2e-new-tokens", "6"]
    assert main(argv + ["--output", str(out)]) == 0
    results = json.loads(out.read_text())
    assert {"cpu", "torch", "transformers", "hf_triforce", "date"} <= set(results["machine"])
    assert [t["kind"] for t in results["tasks"]] == ["natural", "needle"]
    main_rows = [r for r in results["views"] if r["group"] == "main"]
    assert len(main_rows) == 2 * 2 * 2 * 2  # tasks x temperatures x budgets x (retrieval, streaming)
    assert all(0.0 <= r["acceptance"] <= 1.0 + 1e-6 for r in results["views"])
    assert {r["knob"] for r in results["views"] if r["group"] == "ablation"} >= {"combine", "chunk_size"}
    assert {r["drafter"] for r in results["level0"]} == {"none", "ngram", "model-1L"}
    e2e = results["end_to_end"]
    assert {r["drafter"] for r in e2e} == {"none", "ngram", "model-1L"}
    greedy = [r["tokens"] for r in e2e if r["temperature"] == 0 and r["task"] == e2e[0]["task"]]
    assert all(tokens == greedy[0] for tokens in greedy), "greedy TriForce output must not depend on the drafter"
    used = [sum(r["stats"]["levels"][k]["drafted"] for k in ("level0", "level0_to_level2")) for r in e2e]
    assert any(n for n, r in zip(used, e2e, strict=True) if r["drafter"] == "model-1L"), "model drafter unused"
    value, positions = pooled(main_rows, task_kind="natural", temperature=0.0)
    assert positions == 4 * 9 and 0 <= value <= 1
    page = out.with_suffix(".md").read_text()
    for heading in ("## Must-show checks", "## Needle tasks", "## Selection policy ablations", "## End to end"):
        assert heading in page, page
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_drafts_without_needles_says_so(capsys, tmp_path, saved_model):
    """Natural prompts alone (``--needle-depths ''``): the needle check reads "not measured", not "NOT met"."""
    model_dir, doc = saved_model
    out = tmp_path / "natural.json"
    argv = ["eval-drafts", "--model", model_dir, "--document", doc, "--context-tokens", "400", "--new-tokens", "6"]
    argv += ["--budgets", "1/4", "--headline-budget", "1/4", "--temperatures", "0", "--natural-prompts", "1"]
    argv += ["--needle-depths", "", "--no-ablations", "--no-end-to-end", "--draft-layers", ""]
    assert main(argv + ["--output", str(out)]) == 0
    assert [t["kind"] for t in json.loads(out.read_text())["tasks"]] == ["natural"]
    checks = out.with_suffix(".md").read_text().split("## Must-show checks")[1].split("##")[0]
    assert "- Needle tasks: not measured (no needle depths)." in checks, checks
    assert "- Natural continuation, retrieval >= StreamingLLM" in checks, checks
    page = out.with_suffix(".md").read_text()
    assert "## Needle tasks" not in page and "| needle |" not in page, "no empty needle table"
    assert "| natural | " in page.split("## Replayed rounds")[1], "the natural row of the replayed rounds stays"


def test_eval_drafts_natural_prompts_from_several_haystacks(capsys, tmp_path, saved_model):
    """``--natural-haystacks``: ``--natural-prompts`` slices of each named haystack replace the document's, the
    verdict pools them all and the report adds a table per haystack."""
    model_dir, doc = saved_model
    out = tmp_path / "genres.json"
    argv = ["eval-drafts", "--model", model_dir, "--document", doc, "--context-tokens", "300", "--new-tokens", "6"]
    argv += ["--budgets", "1/4", "--headline-budget", "1/4", "--temperatures", "0", "--natural-prompts", "2"]
    argv += ["--natural-haystacks", "code,guide", "--needle-depths", "", "--no-ablations", "--no-end-to-end"]
    assert main(argv + ["--draft-layers", "", "--output", str(out)]) == 0
    tasks = json.loads(out.read_text())["tasks"]
    assert [t["name"] for t in tasks] == ["code#0", "code#1", "guide#0", "guide#1"]
    assert all(t["kind"] == "natural" and t["prompt_tokens"] == 294 for t in tasks)
    assert 0 < tasks[0]["start_token"] < tasks[1]["start_token"], "slices start inside the text, in order"
    page = out.with_suffix(".md").read_text()
    assert "Pooled over 4 prompts (raw text, 2 slice(s) of each haystack: code, guide)" in page, page
    table = page.split("Per haystack:")[1].split("##")[0]
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")][1:] == ["code", "guide"]
    checks = page.split("## Must-show checks")[1].split("##")[0]
    counts = re.search(r" of 20 positions; per prompt ahead on (\d+), behind on (\d+), even on (\d+)", checks)
    assert counts and sum(map(int, counts.groups())) == 4, checks  # the 4 prompts x 5 level-1 positions pooled


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--budgets", "1/0"], "not a number or a fraction"),
        (["--budgets", "1/8", "--headline-budget", "1/4"], "must be one of --budgets"),
        (["--temperatures", "-1"], "temperatures must be >= 0"),
        (["--context-tokens", "5000"], "exceeds the model's context"),
        (["--natural-haystacks", "code,novel"], "unknown --natural-haystacks ['novel']"),
    ],
)
def test_eval_drafts_user_errors_are_one_line(capsys, saved_model, extra, expected):
    model_dir, doc = saved_model
    assert main(["eval-drafts", "--model", model_dir, "--document", doc, *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("hf-triforce: error: ") and expected in errors[0], err


def test_eval_drafts_copy_tasks_report_per_token_acceptance(capsys, tmp_path, saved_model):
    """``--copy-tasks heldout``: every passage kind at each depth, per-token acceptance by kind and depth, verdicts
    against the copy targets, and the per-budget copy panels in the figure."""
    model_dir, doc = saved_model
    out = tmp_path / "copy.json"
    argv = ["eval-drafts", "--model", model_dir, "--document", doc, "--context-tokens", "600", "--new-tokens", "10"]
    argv += ["--budgets", "1/16,1/8", "--temperatures", "0", "--natural-prompts", "1", "--needle-depths", "0.2,0.8"]
    argv += ["--copy-tasks", "heldout", "--draft-layers", "", "--no-end-to-end", "--output", str(out)]
    assert main(argv) == 0
    results = json.loads(out.read_text())
    copy_tasks = [t for t in results["tasks"] if t["kind"] == "copy"]
    assert [(t["passage_kind"], t["depth"]) for t in copy_tasks] == [
        (k, d) for k in ("prose", "identifiers", "code", "table") for d in (0.2, 0.8)
    ]
    assert all(t["split"] == "heldout" and t["prompt_tokens"] <= 590 for t in copy_tasks)
    rows = [r for r in results["views"] if r["task_kind"] == "copy"]
    assert all(r["passage_kind"] and (r["per_token"] is None or 0 <= r["per_token"] <= 1) for r in rows)
    assert {r["knob"] for r in results["views"] if r["group"] == "ablation"} >= {"lookahead_chunks"}
    page = out.with_suffix(".md").read_text()
    assert "## Copy tasks (heldout split)" in page and "## Needle tasks" not in page
    assert "budget 1/8, T=0, per-token retrieval acceptance >= 0.97" in page
    assert "budget 1/16, T=0, per-token retrieval acceptance >= 0.93" in page
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_view_policy_refuses_a_config_with_step_selection():
    from hf_triforce import TriForceConfig

    assert ViewPolicy.from_config(TriForceConfig(), budget=256).budget == 256
    with pytest.raises(ValueError, match="step_selection"):
        ViewPolicy.from_config(TriForceConfig(step_selection=True))
