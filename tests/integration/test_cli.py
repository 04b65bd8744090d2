"""``hf-triforce demo`` end to end on a tiny saved model, and the one-line errors a newcomer meets.

The model directory holds a tiny random Llama and a word-level tokenizer built offline with a chat
template, saved with ``save_pretrained`` exactly as a user's model would be; the CLI loads it through
``--model``. User errors must print one ``hf-triforce: error: ...`` line and return 2 without a
traceback; ``--debug`` re-raises so the traceback shows. ``hf-triforce --help`` loads neither torch nor
transformers. The research bench's options (``research/lab_bench.py``) are ``tests/research/test_lab_bench.py``'s.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_triforce import TriForceConfig
from hf_triforce.bench.documents import DocumentError, question_prompt, read_document
from hf_triforce.bench.loading import ModelLoadError
from hf_triforce.bench.options import DEFAULT_PLAIN
from hf_triforce.cli import CUDA_GRAPHS, REMOVED, build_parser, main
from tests.support.cli_errors import one_line_error as cli_one_line_error
from tests.support.tiny_chat_model import WORDS, save_model, word_tokenizer

pytestmark = pytest.mark.integration


one_line_error = functools.partial(cli_one_line_error, main)


def test_demo_runs_end_to_end(capsys, model_dir, document, tmp_path):
    """The defaults: one greedy and one sampled comparison, a summary, and the figures in a JSON file."""
    argv = ["demo", "--model", model_dir, "--document", document, "--document-tokens", "600"]
    output = tmp_path / "demo.json"
    assert main(argv + ["--max-new-tokens", "24", "--retrieval-budget", "128", "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert "TriForce answer at T=0 (greedy) (streamed):" in out
    assert "TriForce answer at T=0.6 (top-p 0.9) (streamed):" in out
    for row in ("decode tokens/s", "speedup", "acceptance", "mean tokens per full-cache forward", "peak process",
                "answer repeats itself: "):  # fmt: skip
        assert out.count(row) >= 2, out
    assert "identical text: yes" in out and "identical text: n/a when sampling" in out, out
    level1 = next(line for line in out.splitlines() if line.startswith("level-1 ("))
    assert "per token" in level1 or "nothing drafted" in level1, level1
    summary = out[out.index("Summary (decode speed, prefill excluded):") :].splitlines()[1:3]
    assert "T=0 (greedy)" in summary[0] and "identical text: yes" in summary[0], summary
    assert "T=0.6 (top-p 0.9)" in summary[1] and "n/a (sampling)" in summary[1], summary
    record = json.loads(output.read_text())
    assert [row["temperature"] for row in record["rows"]] == [0.0, 0.6]
    assert record["rows"][0]["identical_output"] is True and record["machine"]["torch"] == torch.__version__
    assert record["rows"][0]["generate_kwargs"]["repetition_penalty"] == 1.2
    assert all(0.0 <= row["answer_repeated_fraction"] <= 1.0 and isinstance(row["answer"], str)
               for row in record["rows"])  # fmt: skip


def test_demo_without_repetition_penalty(capsys, model_dir, document):
    """``--repetition-penalty 1`` switches the penalty off: generate() gets no processor for it."""
    argv = ["demo", "--model", model_dir, "--document", document, "--document-tokens", "300", "--temperatures", "0"]
    assert main(argv + ["--max-new-tokens", "8", "--retrieval-budget", "128", "--repetition-penalty", "1"]) == 0
    out = capsys.readouterr().out
    assert "identical text: yes" in out and "T=0.6" not in out, out


def test_questions_demo(capsys, model_dir, document, tmp_path):
    """``--questions 2``: two questions from one prefilled document, texts identical, figures in a JSON file."""
    output = tmp_path / "questions.json"
    argv = ["demo", "--model", model_dir, "--document", document, "--document-tokens", "300", "--questions", "2",
            "--output", str(output)]  # fmt: skip
    assert main(argv + ["--max-new-tokens", "8", "--retrieval-budget", "128", "--temperatures", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("identical text: yes") == 2 and "TriForce + reuse vs plain + reuse" in out, out
    record = json.loads(output.read_text())
    assert record["kind"] == "demo-questions" and record["temperatures"] == [0.0] and len(record["questions"]) == 2
    assert len(record["results"][0]["answers"]["triforce_reuse"]) == 2


def test_too_many_questions_refused_before_loading(capsys, tmp_path, document):
    argv = ["demo", "--model", str(tmp_path / "no-model"), "--document", document, "--questions", "99"]
    one_line_error(capsys, argv, "--questions 99: the demo has")


def test_bad_temperatures_are_one_line(capsys, model_dir, document):
    argv = ["demo", "--model", model_dir, "--document", document]
    one_line_error(capsys, argv + ["--temperatures", "0,warm"], "'warm' is not a number")
    one_line_error(capsys, argv + ["--temperatures", ","], "comma-separated numbers")
    one_line_error(capsys, argv + ["--temperatures", "-1"], "values >= 0")
    one_line_error(capsys, argv + ["--repetition-penalty", "0"], "must be > 0")


def test_demo_samples(capsys, model_dir, document):
    argv = ["demo", "--model", model_dir, "--document", document, "--document-tokens", "300", "--temperature", "0.8"]
    assert main(argv + ["--max-new-tokens", "12", "--retrieval-budget", "128", "--drafter", "none"]) == 0
    assert "identical text: n/a when sampling" in capsys.readouterr().out


def test_missing_document(capsys, tmp_path):
    one_line_error(capsys, ["demo", "--document", str(tmp_path / "nope.txt")], "document not found")


def test_unreadable_document(capsys, tmp_path):
    path = tmp_path / "binary.txt"
    path.write_bytes(b"\xff\xfe\x00\x81" * 100)
    one_line_error(capsys, ["demo", "--document", str(path)], "as UTF-8 text")


def test_empty_document(capsys, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("  \n")
    one_line_error(capsys, ["demo", "--document", str(path)], "is empty")


def test_missing_model(capsys, tmp_path, document):
    one_line_error(capsys, ["demo", "--model", str(tmp_path / "no-model"), "--document", document], "does not exist")


def test_directory_without_a_model(capsys, tmp_path, document):
    (tmp_path / "empty-model").mkdir()
    one_line_error(capsys, ["demo", "--model", str(tmp_path / "empty-model"), "--document", document], "no config.json")


def test_model_directory_without_a_tokenizer(capsys, tmp_path, document):
    path = tmp_path / "weights-only"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(path)  # fmt: skip
    one_line_error(capsys, ["demo", "--model", str(path), "--document", document], "could not load")


def test_no_chat_template(capsys, tmp_path, document):
    path = save_model(tmp_path / "base-model", chat_template=None)
    one_line_error(capsys, ["demo", "--model", path, "--document", document], "no chat template")


def test_question_too_long(capsys, tmp_path, document):
    path = save_model(tmp_path / "short-context", context=64)
    question = " ".join(["what is the context manager"] * 20)
    argv = ["demo", "--model", path, "--document", document, "--question", question, "--max-new-tokens", "8"]
    one_line_error(capsys, argv, "shorten the question")


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(DocumentError):
        main(["demo", "--debug", "--document", str(tmp_path / "nope.txt")])
    with pytest.raises(ModelLoadError):
        main(["--debug", "demo", "--model", str(tmp_path / "nope")])


@pytest.mark.parametrize(
    "old,new", [("--budgets", "--retrieval-budget"), ("--drafters", "--drafter"), ("--tree-budgets", "--tree-budget")]
)
def test_renamed_bench_options_say_their_new_name(capsys, old, new):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", old, "1"])
    assert exit_info.value.code == 2
    assert f"{old} was renamed in 0.3: use {new}" in capsys.readouterr().err


@pytest.mark.parametrize("old", REMOVED)
def test_removed_bench_options_say_where_they_went(capsys, old):
    """The research options left the package in 0.3: a usage error says so (not "unrecognized arguments")."""
    for argv in (["bench", old], ["bench", old, "1"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert f"{old} was removed from hf-triforce bench in 0.3" in capsys.readouterr().err


def test_help_loads_neither_torch_nor_transformers():
    """``hf-triforce --help`` took ~6 s when the parser imported the whole package; it imports light modules."""
    code = (
        "import sys, contextlib, io\n"
        "from hf_triforce.cli import main\n"
        "for argv in (['--help'], ['estimate', '--help'], ['bench', '--help'], ['demo', '--help']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        main(argv)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    assert time.perf_counter() - start < 5  # ~0.1 s on the 2-core CI machine; generous for a loaded one


def test_estimate_help_has_a_description_and_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    out = capsys.readouterr().out
    assert "Will TriForce help this model at this context on this GPU?" in out
    assert "example:\n  hf-triforce estimate --model ./Llama-3.1-8B-Instruct --context 64k --gpu h100" in out


def test_bench_defaults_are_the_configs():
    args = build_parser().parse_args(["bench"])
    defaults = TriForceConfig()
    assert args.retrieval_budget == str(defaults.retrieval_budget) and args.drafter == defaults.drafter
    assert args.tree_budget == str(defaults.tree_budget) and CUDA_GRAPHS[args.cuda_graphs] == defaults.cuda_graphs


def test_bad_budget_is_one_line(capsys, model_dir, document):
    argv = ["demo", "--model", model_dir, "--document", document, "--retrieval-budget", "100"]
    one_line_error(capsys, argv, "try 96")


def test_document_is_cut_to_fit_the_context():
    tokenizer = word_tokenizer()
    text = " ".join(WORDS * 40)
    ids = question_prompt(tokenizer, text, "what is it", document_tokens=None, context_limit=200, reserve=50)
    assert 150 - 5 <= ids.shape[1] <= 150
    ids = question_prompt(tokenizer, text, "what is it", document_tokens=30)
    assert ids.shape[1] == 30 + len("<user> Question: what is it <bot>".split())


def test_default_document_is_the_python_reference():
    text = read_document(None)
    assert "context manager" in text and len(text) > 400_000


def test_bench_writes_json_and_markdown(capsys, tmp_path, model_dir, document):
    out = tmp_path / "results" / "bench.json"
    argv = ["bench", "--model", model_dir, "--document", document, "--prompt-tokens", "300", "--temperatures", "0,0.7"]
    argv += ["--prompt-lookup", "4", "--drafter", "none"]
    assert main(argv + ["--retrieval-budget", "128", "--new-tokens", "10", "--output", str(out)]) == 0
    results = json.loads(out.read_text())
    assert {"cpu", "torch", "transformers", "hf_triforce", "date"} <= set(results["machine"])
    assert [row["temperature"] for row in results["rows"]] == [0.0, 0.7]
    for row in results["rows"]:
        assert row["plain"]["new_tokens"] == row["triforce"]["new_tokens"] == row["prompt_lookup"]["new_tokens"] == 10
        assert row["drafter"] == "none" and row["config"]["adaptive"] is True
        plain = row["plain"]
        assert plain["end_to_end_seconds"] >= plain["prefill_seconds"] + 9 * plain["decode_seconds_per_token"] - 1e-9
        assert row["speedup"] > 0 and row["weight_bytes"] > 0
    assert results["rows"][0]["identical_output"] is True and results["rows"][0]["divergence"] is None
    assert results["rows"][1]["divergence"] is None  # sampled: nothing to classify
    page = out.with_suffix(".md").read_text()
    for heading in ("| prompt | T |", "## Per prompt (tokens/s)", "## Every row", "## Where the time goes"):
        assert heading in page, page
    for row in results["rows"]:  # every plain decoding a user can choose, timed or said why not
        runs = row["plain_decodings"]
        assert list(runs) == list(DEFAULT_PLAIN)
        assert all(runs[n]["error"].startswith("not run") for n in ("sdpa_flash", "flash_attention_2",
                                                                    "continuous_batching"))  # fmt: skip
        ran = {n: r for n, r in runs.items() if "error" not in r}
        assert set(ran) == {"dynamic", "static", "static_compiled"}
        assert row["best_plain"] == min(ran, key=lambda n: ran[n]["decode_seconds_per_token"])
        best = ran[row["best_plain"]]["decode_seconds_per_token"]
        assert row["speedup_best_plain"] == pytest.approx(best / row["triforce"]["decode_seconds_per_token"])
        assert row["prompt"]["name"] == "custom" and isinstance(row["loops"], bool)
    assert results["rows"][0]["plain_decodings"]["static"]["identical_to_default"] is True
    assert [s["temperature"] for s in results["summary"]] == [0.0, 0.7]
    assert "## Median over prompts, against the fastest plain decoding" in page and "best plain**" in page


def test_bench_runs_the_prompt_set_by_default(capsys, tmp_path, model_dir):
    """Without --document/--question the rows are the bench's documents, each named, its answer checked."""
    out = tmp_path / "set.json"
    argv = ["bench", "--model", model_dir, "--prompts", "code,table", "--prompt-tokens", "200", "--temperatures", "0"]
    argv += ["--retrieval-budget", "128", "--new-tokens", "8", "--plain", "dynamic,static", "--output", str(out)]
    assert main(argv) == 0
    results = json.loads(out.read_text())
    assert [r["prompt"]["name"] for r in results["rows"]] == ["code", "table"]
    assert results["rows"][1]["prompt"]["source"] == "html.entities.html5"
    assert all(set(r["plain_decodings"]) == {"dynamic", "static"} and "loops" in r for r in results["rows"])
    (summary,) = results["summary"]
    assert summary["prompts"] + len(summary["left_out"]) == 2
    assert "| code | " in out.with_suffix(".md").read_text()


def test_bench_prompt_errors_come_before_loading(capsys, tmp_path, document):
    missing = str(tmp_path / "no-model")
    one_line_error(capsys, ["bench", "--model", missing, "--plain", "dynamic,vllm"], "unknown plain decoding 'vllm'")
    one_line_error(capsys, ["bench", "--model", missing, "--prompts", "poetry"], "unknown prompt 'poetry'")
    argv = ["bench", "--model", missing, "--prompts", "code", "--document", document]
    one_line_error(capsys, argv, "--prompts chooses among the bench's own documents")


def test_demo_says_which_document_it_used(capsys, model_dir):
    argv = ["demo", "--model", model_dir, "--prompt", "changelog", "--document-tokens", "200", "--temperatures", "0"]
    assert main(argv + ["--max-new-tokens", "6", "--retrieval-budget", "128"]) == 0
    out = capsys.readouterr().out
    assert "Document: idlelib/NEWS.txt (changelog; --prompt chooses another of: prose, reference" in out, out
    assert "Question: Using only the release notes above" in out and "identical text: yes" in out


def test_bench_passes_its_config_options_to_every_triforce_call(tmp_path, model_dir, document):
    out = tmp_path / "options.json"
    argv = ["bench", "--model", model_dir, "--document", document, "--prompt-tokens", "300", "--temperatures", "0"]
    argv += ["--retrieval-budget", "128", "--new-tokens", "12", "--drafter", "none", "--plain", "dynamic"]
    argv += ["--cuda-graphs", "false", "--rescore-candidates", "0", "--no-adaptive", "--gamma2", "3", "--tree-budget"]
    assert main(argv + ["0", "--level1-weights", "full", "--output", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    config = row["config"]
    assert (config["rescore_candidates"], config["adaptive"], config["gamma2"], config["tree_budget"]) == (
        0,
        False,
        3,
        0,
    )
    assert config["cuda_graphs"] is False and row["triforce"]["triforce"]["level1_weights"] == "full"
    assert row["tree_budget"] == 0 and row["triforce"]["triforce"]["levels"]["level1"]["drafted"] > 0
    assert row["identical_output"] is True and row["divergence"] is None
