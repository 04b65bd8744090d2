"""The bench's prompt set: seven offline documents of different genres, each with its question."""

from __future__ import annotations

import pytest

from hf_triforce.bench.documents import DocumentError
from hf_triforce.bench.prompt_set import BENCH_PROMPTS, bench_prompt, prompt_record, user_prompt

pytestmark = pytest.mark.unit


def test_at_least_six_genres_each_with_a_question():
    assert len({p.genre for p in BENCH_PROMPTS}) == len(BENCH_PROMPTS) >= 6
    assert len({p.name for p in BENCH_PROMPTS}) == len(BENCH_PROMPTS)
    for p in BENCH_PROMPTS:
        assert p.question.startswith("Using only the") and p.question.endswith("?"), p.name


@pytest.mark.parametrize("prompt", BENCH_PROMPTS, ids=lambda p: p.name)
def test_every_document_is_long_enough_for_a_7k_prompt(prompt):
    text = prompt.text()
    assert len(text) > 30_000, (prompt.name, len(text))  # > 7K tokens at ~4 characters a token
    assert text == prompt.text()  # the same text on every call


def test_documents_are_of_their_genre():
    texts = {p.name: p.text() for p in BENCH_PROMPTS}
    assert texts["code"].lstrip().startswith(("#", '"""', "'''", "import")) and "class ArgumentParser" in texts["code"]
    table = texts["table"].splitlines()
    assert table[0] == "name | character | code points" and all(line.count(" | ") == 2 for line in table[1:50])
    assert "&Aacute; | 'Á' | U+00C1" in table
    sessions = texts["transcript"]
    assert sessions.count(">>> ") > 200 and "import unittest" not in sessions  # the sessions, not the test code
    assert "Guido van Rossum" in texts["prose"] and "<" not in texts["guide"][:2000]  # markup removed


def test_unknown_prompt_names_the_choices():
    with pytest.raises(DocumentError, match="choose from .*'prose'"):
        bench_prompt("poetry")


def test_a_users_document_is_read_at_once(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("some notes", encoding="utf-8")
    prompt = user_prompt(str(path), "What do the notes say?")
    assert prompt.text() == "some notes" and prompt_record(prompt)["source"] == str(path)
    with pytest.raises(DocumentError, match="not found"):
        user_prompt(str(tmp_path / "missing.txt"), "?")
    assert user_prompt(None, "q").source == "the Python language reference"
