# `make demo` and `make test` each create .venv on first use, install torch there only when no
# torch is importable (a system-wide one is reused), then install trainguard: alone for the demo,
# with its development extras for the tests.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.trainguard-installed
DEMO_STAMP := $(VENV)/.trainguard-core-installed

# Debian packages that tests drive (each such test skips without its command), as COMMAND:PACKAGE.
# `make test` installs the missing ones when run as root, with one `apt-get update` for all.
SYSTEM_DEPS ?= prometheus:prometheus chromium:chromium

.PHONY: demo test lint bench promises venv clean system-deps

venv: $(STAMP)

# the demo needs trainguard alone (torch, numpy, rich); the tests need every integration too
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e .
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/trainguard demo

system-deps:
	@missing=""; for dep in $(SYSTEM_DEPS); do \
	  command -v "$${dep%%:*}" >/dev/null 2>&1 || missing="$$missing $${dep#*:}"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  echo "installing$$missing"; apt-get update && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; fi

test: venv system-deps
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy src/trainguard

bench: venv
	$(BIN)/python benchmarks/overhead.py

promises: venv
	$(BIN)/python -m benchmarks.promises

clean:
	rm -rf $(VENV) trainguard-demo .pytest_cache
