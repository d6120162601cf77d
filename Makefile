# `make demo` and `make test` each create .venv on first use, install torch there only when no
# torch is importable (a system-wide one is reused), then install trainguard with its extras.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.trainguard-installed

.PHONY: demo test lint bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP)

demo: venv
	$(BIN)/trainguard demo

test: venv
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy src/trainguard

bench: venv
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) trainguard-demo .pytest_cache
