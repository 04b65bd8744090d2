"""Every script in ``examples/`` runs on the real SmolLM2-135M-Instruct and prints what its docstring promises.

Each runs as a subprocess (as a user would run it) with ``HF_TRIFORCE_EXAMPLE_SMALL=1``, which shrinks
the document and the number of new tokens; two at a time, one thread each (:data:`WORKERS`). A greedy
TriForce output that differs from plain ``generate()`` fails the test through the promised ``... True`` /
``identical text: yes`` lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT_S = 240
WORKERS = 1 if "PYTEST_XDIST_WORKER" in os.environ else min(2, os.cpu_count() or 1)
"""Examples run at once, each on one thread: a script spends about 10 s importing and loading the model on one
core (two threads each oversubscribe 2 cores: 5.4 min instead of 1.9). 1 in a pytest-xdist worker (``make
test``), whose workers already share the cores."""

# script -> regular expressions that must each match a line of its stdout
PROMISES: dict[str, list[str]] = {
    "quickstart.py": [
        r"^Answer: \S",
        r"^identical to plain generate\(\): True$",
        r"^level-1 \(retrieval\) acceptance: \d\.\d\d$",
    ],
    "pipeline_chat.py": [r"^Pipeline answer: \S", r"^tokens per full-cache forward: \d+\.\d\d"],
    "streaming.py": [r"^streamed [1-9]\d* tokens in [1-9]\d* chunks \("],
    "long_document_qa.py": [
        r"^Answer: \S",
        r"^decode speed: plain [\d.]+ tok/s, TriForce [\d.]+ tok/s, speedup [\d.]+x$",
        r"^identical text: yes$",
    ],
    "multi_turn_chat.py": [
        r"^Turn 1: \S",
        r"^Turn 2: \S",
        r"^turn 2 prefilled \d+ of \d+ prompt tokens",
        r"^identical to plain generate\(\): True$",
    ],
    "several_questions.py": [
        r"^Q1: \S",
        r"^A1: \S",
        r"^identical text: yes$",
        r"^TriForce \+ reuse: [\d.]+x plain \+ reuse, [\d.]+x plain without reuse$",
    ],
    "own_draft_model.py": [
        r"^level-0 \(draft model\) acceptance: \d\.\d\d \(\d+/[1-9]\d* drafted tokens\)$",
        r"^identical to plain generate\(\): True$",
        r"^a draft model with another vocabulary is refused: ",
    ],
    "two_level.py": [
        r"^two levels \(none\) +- +\d\.\d\d",
        r"^two levels \(drafter='none'\) identical to plain generate\(\): True$",
        r"^three levels \(drafter='ngram'\) identical to plain generate\(\): True$",
    ],
}


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(PROMISES)


@pytest.fixture(scope="module")
def example_runs(request, smollm2) -> dict[str, Future]:
    """The examples this session tests (``-k`` may deselect some), started :data:`WORKERS` at a time: script -> its
    finished process (a future).

    ``smollm2`` makes sure the safetensors cache exists before the subprocesses load it."""
    if WORKERS == 1:  # each test runs its script (under xdist a worker's session lists tests other workers run)
        yield {}
        return
    selected = {
        item.callspec.params["script"]
        for item in request.session.items
        if getattr(item, "originalname", None) == test_example_runs_and_prints_its_promise.__name__
    }
    with ThreadPoolExecutor(WORKERS) as pool:
        yield {script: pool.submit(_run, script) for script in sorted(selected)}


def _run(script: str) -> subprocess.CompletedProcess:
    threads = {"OMP_NUM_THREADS": "1"} if WORKERS > 1 else {}
    env = {**os.environ, "HF_TRIFORCE_EXAMPLE_SMALL": "1", "TOKENIZERS_PARALLELISM": "false", **threads}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, env=env, timeout=TIMEOUT_S
    )


@pytest.mark.parametrize("script", sorted(PROMISES))
def test_example_runs_and_prints_its_promise(script, example_runs):
    proc = example_runs[script].result() if script in example_runs else _run(script)
    assert proc.returncode == 0, f"{script} exited with {proc.returncode}\n--- stderr ---\n{proc.stderr[-4000:]}"
    for promise in PROMISES[script]:
        assert re.search(promise, proc.stdout, re.MULTILINE), (
            f"{script} did not print a line matching {promise!r}\n--- stdout ---\n{proc.stdout[-4000:]}"
        )
