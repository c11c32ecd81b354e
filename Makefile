# Set-up is two commands: `make demo` and `make test`. Both create or reuse .venv.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test test-all demo lint bench clean browser node-deps
CHROMIUM := /usr/bin/chromium

# torch first and pinned: 2.13.0 is the CPU wheel on this project's machines; an unpinned
# torch would pull the multi-GB CUDA build. Elsewhere, install it from PyTorch's CPU index
# into .venv first (README, Set-up); pip then keeps it.
$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV) once (a few minutes; later runs reuse it)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	@echo "make: [1/3] pip itself"
	@$(BIN)/python -m pip install -q --upgrade pip
	@echo "make: [2/3] PyTorch 2.13.0, CPU build (about 750 MB installed)"
	@$(BIN)/python -m pip install -q "torch==2.13.0"
	@echo "make: [3/3] tracekit and its analysis, demo and test dependencies (about 1.5 GB installed)"
	@$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)
	@echo "make: $(VENV) ready"

venv: $(STAMP)

# The HTML report's tests drive a real headless Chromium from Debian's packages. Without
# root or a package mirror the install fails; those tests then skip and say why.
$(CHROMIUM):
	-apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

browser: $(CHROMIUM)

# The Node.js OpenTelemetry SDK that tests/collect/test_node_sdk.py exports through, pinned
# by tests/collect/node/package-lock.json and installed into .cache/node (never into the
# tests folder). Re-runs only when the lock file changes; without node and npm, or when
# npm cannot install, those tests skip and say why.
NODE_SRC := tests/collect/node
NODE_CACHE := .cache/node
NODE_STAMP := $(NODE_CACHE)/.installed

$(NODE_STAMP): $(NODE_SRC)/package.json $(NODE_SRC)/package-lock.json
	@if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then \
		mkdir -p $(NODE_CACHE) && \
		cp $(NODE_SRC)/package.json $(NODE_SRC)/package-lock.json $(NODE_CACHE)/ && \
		npm ci --prefix $(NODE_CACHE) --ignore-scripts --no-audit --no-fund --loglevel=error && \
		touch $@ || echo "npm ci failed: the Node.js OpenTelemetry SDK tests will skip"; \
	else \
		echo "node/npm not on PATH: the Node.js OpenTelemetry SDK tests will skip"; \
	fi

node-deps: $(NODE_STAMP)

# `make test`: everything but the end-to-end runs that start real servers for many
# seconds (marked `slow`), within 10 minutes on 2 cores with a third process busy.
# `make test-all` (what CI runs): `make test`, then the slow ones.
test: $(STAMP) $(CHROMIUM) node-deps
	$(BIN)/python -m pytest -q -m "not slow"

test-all: test
	$(BIN)/python -m pytest -q -m slow

demo: $(STAMP)
	$(BIN)/tracekit demo

lint: $(STAMP)
	$(BIN)/ruff check tracekit tests benchmarks .ci
	$(BIN)/ruff format --check tracekit tests benchmarks .ci
	$(BIN)/mypy tracekit
	$(BIN)/lint-imports
	$(BIN)/python .ci/thin_commands.py

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/diff.py
	$(BIN)/python benchmarks/collect.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
