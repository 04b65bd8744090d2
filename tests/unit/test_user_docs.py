"""What a user reads: one GPU config everywhere, user pages without lab notes, and nothing the installed package prints
that points at a file an installed copy lacks.

User pages are the README and every page of the documentation but the Project history (``docs/history.md``, the
records and the changelog): none cites a commit hash, a record file (``benchmarks/results/...``), or
``DESIGN.md``. The package's strings (its messages, the estimate's output, its docstrings) do not either, and its
messages name no repository path (``docs/...md``, ``tests/...``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from transformers import LlamaConfig

from hf_triforce.bench.estimate import estimate, format_estimate

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HISTORY = "history.md"
GPU_CONFIG_MARK = "<!-- gpu-config -->"
RECORDS = {p.name for p in (ROOT / "benchmarks" / "results").rglob("*") if p.suffix in (".json", ".md", ".log")}
RECORDS -= {"README.md"}
LAB_NOTES = re.compile(r"benchmarks/results|DESIGN\.md|(?<![\w#/-])[0-9a-f]{7,40}(?![\w-])")
REPOSITORY_PATHS = re.compile(r"\bdocs/[\w/-]+\.md|\btests/[\w/]+")
LLAMA_31_8B = LlamaConfig(intermediate_size=14336, num_key_value_heads=8, vocab_size=128256,
                          max_position_embeddings=131072)  # fmt: skip


def user_pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p.name != HISTORY and "assets" not in p.parts]


def lab_notes(text: str) -> list[str]:
    """Commit hashes, record paths and file names, and DESIGN.md citations in ``text``."""
    found = [hit for hit in LAB_NOTES.findall(text) if not hit.isdigit()]
    return found + sorted(name for name in RECORDS if name in text)


def test_one_gpu_config_everywhere():
    """The README's GPU snippet, the quickstart's GPU program, the tuning guide's GPU row and the estimate's
    ``recommended:`` line (Llama-3.1-8B at 64K on an H100) give one and the same call."""
    calls = {}
    for page in ("README.md", "docs/quickstart.md", "docs/tuning.md"):
        after = (ROOT / page).read_text().split(GPU_CONFIG_MARK)
        assert len(after) == 2, f"{page} marks its GPU config once ({GPU_CONFIG_MARK})"
        calls[page] = re.search(r"TriForceConfig\([^)]*\)", after[1]).group(0)
    result = estimate(LLAMA_31_8B, 65536, "h100")
    calls["hf-triforce estimate"] = result.recommended_expression()
    assert set(calls.values()) == {"TriForceConfig()"}, calls
    assert "recommended: TriForceConfig()" in format_estimate(result, "llama")


def rendered(page: Path) -> list[str]:
    """The page's lines as the site shows them: each snippet include (``--8<-- "path[:start[:end]]"``) replaced by the
    lines it includes."""
    lines = []
    for line in page.read_text().splitlines():
        include = re.match(r'--8<-- "([^":]+)(?::(\d*))?(?::(\d*))?"', line.strip())
        if include is None:
            lines.append(line)
            continue
        path, start, end = include.groups()
        target = ROOT / path if (ROOT / path).exists() else ROOT / "docs" / path
        included = target.read_text().splitlines()
        lines += included[int(start or 1) - 1 : int(end) if end else None]
    return lines


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_carry_no_lab_notes(page):
    found = [(n, lab_notes(line)) for n, line in enumerate(rendered(page), 1) if lab_notes(line)]
    assert not found, f"{page.relative_to(ROOT)}: {found} (the Project history page is where records are named)"


def test_the_nav_starts_with_the_quickstart_and_keeps_history_in_one_page():
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].split("\n\n", 1)[0]
    entries = re.findall(r"^\s*- ([^:]+): (\S+\.md)$", nav, re.M)
    assert entries[0] == ("Quickstart", "quickstart.md")
    assert ("Project history", HISTORY) in entries and not [e for e in entries if "changelog" in e[1]]
    assert not (ROOT / "docs" / "changelog.md").exists()


def _strings(path: Path) -> tuple[list[str], list[str]]:
    """``(docstrings, every other string constant)`` of a module."""
    tree = ast.parse(path.read_text())
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and (doc := ast.get_docstring(node, False)):
            docs.append(doc)
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return docs, [s for s in strings if s not in docs]


@pytest.mark.parametrize("path", sorted((ROOT / "hf_triforce").rglob("*.py")), ids=lambda p: p.name)
def test_the_package_names_no_record_and_no_missing_file(path):
    """An installed copy has neither the records nor the repository's docs and tests: its strings do not cite the
    records (or DESIGN.md), and what it prints names no repository path."""
    docs, messages = _strings(path)
    assert not [(s[:80], lab_notes(s)) for s in docs + messages if lab_notes(s)]
    assert not [(s[:80], REPOSITORY_PATHS.findall(s)) for s in messages if REPOSITORY_PATHS.findall(s)]


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100"])
def test_the_estimate_prints_no_record_path(gpu):
    text = format_estimate(estimate(LLAMA_31_8B, 65536, gpu), "llama")
    assert not lab_notes(text) and not REPOSITORY_PATHS.findall(text) and ".json" not in text
