# Two commands do all the set-up on a fresh machine (Python 3.11 + pip):
#   make demo   - create .venv, install, run the main job on a bundled real trace
#   make test   - create .venv, install, run the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/marconi demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# A developer's loop (under a minute): everything but the tests marked slow (CI runs those too).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/core_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
