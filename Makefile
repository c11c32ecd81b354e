# Set-up is two commands: `make demo` and `make test`. Both create or reuse .venv.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test demo lint bench clean browser
CHROMIUM := /usr/bin/chromium

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: 2.13.0 is the CPU wheel on local disk; an unpinned
	# torch would pull the multi-GB CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

venv: $(STAMP)

# The HTML report's tests drive a real headless Chromium from Debian's packages. Without
# root or a package mirror the install fails; those tests then skip and say why.
$(CHROMIUM):
	-apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

browser: $(CHROMIUM)

test: $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/tracekit demo

lint: $(STAMP)
	$(BIN)/ruff check tracekit tests benchmarks
	$(BIN)/ruff format --check tracekit tests benchmarks
	$(BIN)/mypy tracekit
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/diff.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
