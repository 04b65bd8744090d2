"""The package as a user installs it: a wheel built from the repository, installed into a fresh directory, runs the
README's CPU snippet with the repository nowhere on the path.

The wheel's dependencies come from the test's own environment (everything the snippet imports but hf_triforce);
hf_triforce itself must come from the installed wheel, not from the checkout or its editable install.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SNIPPET_MARK = "<!-- cpu-snippet:"


def readme_cpu_snippet() -> str:
    """The fenced python block after the README's CPU-snippet marker."""
    readme = (ROOT / "README.md").read_text()
    after = readme.split(SNIPPET_MARK, 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_readme_cpu_snippet_runs_from_an_installed_wheel(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), "."]
    subprocess.run(build, cwd=ROOT, check=True, timeout=300)
    (wheel,) = wheels.glob("hf_triforce-*.whl")
    assert re.match(r"hf_triforce-0\.3\.0-py3-none-any\.whl", wheel.name)
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, timeout=300)
    assert not list(site.rglob("evaluation")) and not list(site.rglob("experiments"))  # the product, not the lab
    assert not (site / "research").exists() and not (site / "tests").exists() and not (site / "benchmarks").exists()
    bench = sorted(p.name for p in (site / "hf_triforce" / "bench").glob("*.py"))
    assert "tp_launch.py" not in bench and "shapes.py" not in bench and "estimate.py" in bench

    script = "import hf_triforce, sys\nprint('FROM', hf_triforce.__file__)\n" + readme_cpu_snippet()
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no longer than level 1's view" not in out.stderr  # the snippet's document is longer than its view
    lines = out.stdout.splitlines()
    assert lines[0] == f"FROM {site / 'hf_triforce' / '__init__.py'}"  # not the checkout
    assert len(lines) >= 3 and 0.0 <= float(lines[-1]) <= 1.0  # an answer, then level 1's acceptance
    help_ = subprocess.run([sys.executable, "-m", "hf_triforce", "estimate", "--help"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert help_.returncode == 0 and "example:" in help_.stdout and "benchmarks/results" not in help_.stdout
