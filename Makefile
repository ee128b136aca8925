# The daily habits. `make demo` sets everything up and runs an example in the
# hardened sandbox; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup docker-up image demo test test-fast lint typecheck format bench clean

$(BIN)/retool-exec: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,server,bench,mcp,ray]'
	touch $@

setup: $(BIN)/retool-exec

# Docker + gVisor up: nothing to do if a daemon answers, else (as root) install
# Debian's docker.io and runsc and start dockerd.
docker-up:
	@bash images/docker-up.sh

image: setup docker-up
	$(BIN)/retool-exec image build --install-tools

demo: setup docker-up image
	$(BIN)/retool-exec doctor
	$(BIN)/retool-exec run --backend docker -c 'import sympy as sp; x = sp.symbols("x"); print(sp.solve(x**2 - 2, x))'

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not docker and not slow"

lint: setup
	$(BIN)/ruff check retool_exec tests benchmarks
	$(BIN)/ruff format --check retool_exec tests benchmarks

format: setup
	$(BIN)/ruff format retool_exec tests benchmarks
	$(BIN)/ruff check --fix retool_exec tests benchmarks

typecheck: setup
	$(BIN)/mypy

bench: setup docker-up
	PYTHON=$(BIN)/python benchmarks/run.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
