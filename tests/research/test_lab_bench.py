"""The research bench (``python -m research.lab_bench``): ``hf-triforce bench`` with the project's own options, on
the CPU. Random-weights shapes with a draft model, the modeled speedups and a figure; interleaved repeats; tensor
parallelism under ``torchrun`` (gloo on the CPU, as ``tests/integration/test_tensor_parallel.py`` launches its
workers), whose launch errors come before anything is loaded; a batch. Its report is the product's page with the
lab's sections after it."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_triforce.bench.bandwidth import modeled_speedup
from research.lab_bench import main as lab
from tests.support.cli_errors import one_line_error as cli_one_line_error

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 240  # a hang (ranks in different collectives) fails the test instead of blocking the run


one_line_error = functools.partial(cli_one_line_error, lab)


def test_lab_random_weights_preset_with_draft_and_plot(capsys, tmp_path):
    out, png = tmp_path / "preset.json", tmp_path / "preset.png"
    argv = ["--preset", "tiny", "--draft-preset", "tiny", "--drafter", "model", "--prompt-tokens", "1k"]
    argv += ["--temperatures", "0", "--retrieval-budget", "128", "--new-tokens", "12"]
    argv += ["--output", str(out), "--plot", str(png)]
    argv += ["--plain", "dynamic"]  # the plain configurations are the first bench test's subject (compiling is slow)
    argv += ["--no-adaptive"]  # level 0 drafts every level-1 step (adaptive, the costs this machine timed decide)
    assert lab(argv + ["--attn-implementation", "eager", "--real-acceptance", "0.9", "--cuda-graphs", "eager"]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["real_acceptance"] == {"level1": 0.9, "source": "given on the command line"}
    phases = row["triforce"]["triforce"]["phases"]
    plain_ms = 1e3 * row["plain"]["decode_seconds_per_token"]
    latencies = [plain_ms] + [phases[p]["ms_per_call"] for p in ("level1", "level2")]
    expected = modeled_speedup(*latencies, 0.9, row["config"]["gamma2"])
    assert row["modeled_speedup"]["real_text_acceptance"] == pytest.approx(expected)
    alpha = row["triforce"]["triforce"]["levels"]["level1"]["per_token_acceptance"]  # expected_tokens takes alpha
    own = modeled_speedup(*latencies, alpha, row["config"]["gamma2"])
    assert row["modeled_speedup"]["this_run_acceptance"] == pytest.approx(own)
    assert row["random_weights"] and row["shape"] == "tiny" and row["prompt_tokens"] == 1024
    assert row["model_config"]["attn_implementation"] == "eager" and row["config"]["cuda_graphs"] == "eager"
    assert row["identical_output"] is True
    levels = row["triforce"]["triforce"]["levels"]
    assert levels["level0"]["drafted"] + levels["level0_to_level2"]["drafted"] > 0, "the draft preset was not used"
    assert row["assisted_generation"]["new_tokens"] == 12  # transformers' assisted generation, the peer
    assert row["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # K and V x layers x KV heads x head_dim x fp32
    assert "## Against the bandwidth model" in out.with_suffix(".md").read_text()
    page = out.with_suffix(".md").read_text()
    assert "GiB (process RSS)" in page and "Real-text acceptance: given on the command line" in page
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lab_repeats_interleaves_pairs_and_reports_the_median(capsys, tmp_path, model_dir, document):
    out = tmp_path / "repeats.json"
    argv = ["--model", model_dir, "--document", document, "--prompt-tokens", "200", "--temperatures", "0"]
    argv += [
        "--retrieval-budget",
        "128",
        "--new-tokens",
        "8",
        "--repeats",
        "3",
        "--level1-weights",
        "full",
        "--plain",
        "dynamic",
    ]
    assert lab(argv + ["--output", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert len(row["repeats"]) == 3 and row["identical_output"] is True
    speedups = sorted(pair["speedup"] for pair in row["repeats"])
    assert row["speedup"] == pytest.approx(speedups[1])  # the median pair is the row
    assert row["config"]["level1_weights"] == "full" and row["triforce"]["triforce"]["level1_weights"] == "full"
    assert "repeated pairs' speedups" in out.with_suffix(".md").read_text()


def test_lab_repeats_with_a_batch_is_refused(capsys, model_dir):
    argv = ["--model", model_dir, "--batch-size", "2", "--repeats", "2"]
    one_line_error(capsys, argv, "--repeats measures interleaved pairs")


def test_lab_unknown_preset_is_one_line(capsys):
    one_line_error(capsys, ["--preset", "gpt-5"], "choose one of")


def torchrun_bench(world: int, argv: list[str]) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node world -m research.lab_bench ...`` (gloo on the CPU, one thread per rank)."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    done = subprocess.run(
        [*command, "-m", "research.lab_bench", *argv], env=env, capture_output=True, text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{done.stderr[-6000:]}"
    return done


@pytest.mark.slow
def test_lab_tp_reports_every_rank(capsys, tmp_path, model_dir, document):
    """Two ranks (1 of the 2 KV heads each): rank 0 alone reports both ranks' figures; each rank caches half of
    what one process does, and both generate the same text."""
    argv = ["--model", model_dir, "--document", document, "--prompt-tokens", "300", "--temperatures", "0"]
    # Chains on both sides: the ranks draft chains only, and a token tree of the one-process run (whether the
    # planner drafts one depends on its timings) can outgrow the full cache's reserved slots, which then double.
    argv += ["--retrieval-budget", "128", "--new-tokens", "10", "--tree-budget", "0"]
    assert lab([*argv, "--output", str(tmp_path / "one.json")]) == 0
    single = json.loads((tmp_path / "one.json").read_text())["rows"][0]["triforce"]["triforce"]
    done = torchrun_bench(2, [*argv, "--tp", "2", "--output", str(tmp_path / "tp.json")])
    results = json.loads((tmp_path / "tp.json").read_text())
    assert results["tensor_parallel"]["ranks"] == 2 and results["tensor_parallel"]["backend"] == "gloo"
    assert results["tensor_parallel"]["kv_heads_per_rank"] == 1
    assert results["command"].startswith("torchrun --nproc-per-node 2 -m research.lab_bench ")
    row = results["rows"][0]
    assert [r["rank"] for r in row["ranks"]] == [0, 1]
    assert row["same_text_on_all_ranks"] is True and row["identical_output"] is True
    for rank in row["ranks"]:
        assert rank["full_cache_bytes"] * 2 == single["full_cache_bytes"]
        # A view holds what its selection chose plus the tokens since: its size depends on where the selections
        # fell, i.e. on the schedule, which the adaptive planner takes from each process's own timings.
        assert rank["view_bytes"] * 2 == pytest.approx(single["view_bytes"], rel=0.1)
        assert rank["plain_ms_per_token"] > 0 and rank["triforce_ms_per_token"] > 0 and rank["verification_ms"] > 0
    page = (tmp_path / "tp.md").read_text()
    assert "## Tensor parallelism: 2 ranks (gloo)" in page
    assert len([line for line in page.splitlines() if line.startswith("| 3") and line.endswith("| yes |")]) == 2
    assert done.stdout.count("# plain generate() vs TriForce") == 1, "a rank other than 0 printed its report"
    assert "Traceback" not in done.stderr and "rror" not in done.stderr, done.stderr


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if the benchmark gets as far as loading a model."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the --tp launch was checked")

    monkeypatch.setattr("research.lab_bench.load_model", refuse)


def test_lab_tp_outside_torchrun_names_the_command(capsys, monkeypatch, model_dir, no_loading):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    error = one_line_error(capsys, ["--tp", "2", "--model", model_dir], "not started by torchrun")
    assert f"Run: torchrun --nproc-per-node 2 -m research.lab_bench --tp 2 --model {model_dir}" in error
    monkeypatch.setenv("WORLD_SIZE", "3")
    one_line_error(capsys, ["--tp", "2", "--model", model_dir], "torchrun started 3 ranks")


def test_lab_tp_kv_heads_must_divide(capsys, monkeypatch, model_dir, no_loading):
    monkeypatch.setenv("WORLD_SIZE", "3")
    argv = ["--tp", "3", "--model", model_dir]
    one_line_error(capsys, argv, "has 2 KV heads, which do not divide by 3: use --tp 2.")
    monkeypatch.setenv("WORLD_SIZE", "2")
    error = one_line_error(capsys, ["--tp", "2"], "SmolLM2-135M-Instruct has 3 KV heads")
    assert error.endswith("use --tp 3."), error


def test_lab_tp_refuses_per_process_options(capsys, monkeypatch, model_dir, no_loading):
    monkeypatch.setenv("WORLD_SIZE", "2")
    one_line_error(capsys, ["--tp", "2", "--preset", "tiny"], "--preset cannot be combined with --tp")
    one_line_error(capsys, ["--tp", "2", "--model", model_dir, "--device", "cpu"], "Drop --device cpu")
