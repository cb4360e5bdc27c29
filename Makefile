# Headwater: `make run` starts a single local node, `make test` runs lint and the suite.
# Both create .venv and install the project into it first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_DIR := proto/headwater/v1
PYTEST_ARGS ?=

.PHONY: run test lint proto bench typecheck-tree clean demo

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/headwater serve

test: $(STAMP) lint
	$(BIN)/pytest $(PYTEST_ARGS)

# mypy resolves headwater.* through a tree of links that mirrors the package-dir
# mapping in pyproject.toml (the runtime uses setuptools' editable finder instead).
typecheck-tree:
	@rm -rf .build/typecheck && mkdir -p .build/typecheck/headwater
	@for f in headwater/*.py headwater/py.typed; do ln -s ../../../$$f .build/typecheck/headwater/; done
	@for d in log node raft client sparkconnector; do ln -s ../../../$$d .build/typecheck/headwater/$$d; done
	@ln -s ../../../$(PROTO_DIR) .build/typecheck/headwater/v1

lint: $(STAMP) typecheck-tree
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p headwater

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

bench: $(STAMP)
	$(BIN)/python scripts/bench_all.py

clean:
	rm -rf .build .venv .pytest_cache .mypy_cache .ruff_cache data
