"""Documentation figures and tables, generated from the recorded results in ``benchmarks/results/``.

``python -m hf_triforce.evaluation.figures.plots benchmarks/results docs/assets/plots`` (``make plots``) reads
every ``*.json`` result file (through :func:`hf_triforce.evaluation.common.results.read_results`, which
upgrades 0.1 stats names) and writes, per file, PNG figures (matplotlib, Agg backend) and markdown table
snippets that the documentation includes, plus a copy of the JSON under ``data/`` so the site can link
to it. Four formats are understood: ``hf-triforce bench`` results (:mod:`.bench_page`),
``hf_triforce.evaluation.bench.tuning`` sweeps (:mod:`.tuning_page`), ``hf-triforce eval-drafts``
draft-quality results (:mod:`.drafts_page`) and ``hf-triforce demo --output`` records (:mod:`.demo_page`); other
files are skipped with a warning.
Nothing is drawn by hand: regenerate after recording new results.

Example:
    >>> kind_of({"rows": [{"knob": "gamma2"}]}), kind_of({"rows": [{"speedup": 2.0, "plain": {}}]})
    ('tuning', 'bench')
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..common.results import read_results
from .bench_page import write_bench
from .demo_page import write_demo
from .drafts_page import write_eval_drafts
from .tuning_page import write_tuning

logger = logging.getLogger(__name__)

WRITERS = {"bench": write_bench, "tuning": write_tuning, "eval-drafts": write_eval_drafts, "demo": write_demo}
"""Each result format's page writer: ``writer(results, out_dir, stem) -> written paths``."""


def kind_of(results: dict[str, Any]) -> str | None:
    """``"bench"``, ``"tuning"``, ``"eval-drafts"``, ``"demo"`` or ``None`` (a format this module does not plot)."""
    if isinstance(results, dict) and results.get("kind") == "demo":
        return "demo"
    if isinstance(results, dict) and "views" in results and "options" in results:
        return "eval-drafts"
    rows = results.get("rows") if isinstance(results, dict) else None
    if not rows or not isinstance(rows, list):
        return None
    if "knob" in rows[0]:
        return "tuning"
    if "speedup" in rows[0] and "plain" in rows[0]:
        return "bench"
    return None


def generate_all(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the figures, tables and data copies of every result in ``results_dir``; returns the paths."""
    out = Path(out_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for path in sorted(Path(results_dir).glob("*.json")):
        results = read_results(path)
        kind = kind_of(results)
        if kind is None:
            logger.warning("skipping %s: not a bench, tuning, eval-drafts or demo result", path)
            continue
        written += WRITERS[kind](results, out, path.stem)
        written.append(Path(shutil.copyfile(path, out / "data" / path.name)))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hf_triforce.evaluation.figures.plots RESULTS_DIR OUT_DIR``."""
    parser = argparse.ArgumentParser(description="Figures and tables for the docs from recorded benchmark results.")
    parser.add_argument("results_dir", nargs="?", default="benchmarks/results")
    parser.add_argument("out_dir", nargs="?", default="docs/assets/plots")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for path in generate_all(args.results_dir, args.out_dir):
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
