# Two commands do all the set-up on a fresh machine (Python 3.11+, Java 17, Maven):
#   make up     run the main job on the embedded default (a local Kafka broker it starts itself)
#   make test   lint (ruff check), then run the whole test suite (starts and stops its own broker)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# a change to the engine reinstalls, which recompiles its compiled parts (setup.py)
ENGINE := $(wildcard streams/engine/*.py) streams/engine/_speedups.c

.PHONY: up lint test test-heavy bench schemas kafka clean

$(STAMP): pyproject.toml setup.py $(ENGINE)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

kafka: $(STAMP)
	$(BIN)/loopwarden broker install

up: kafka
	$(BIN)/loopwarden up --config examples/loopwarden.json5 --demo examples/sample-trace.jsonl

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint kafka
	$(BIN)/python -m pytest -q

test-heavy: kafka
	$(BIN)/python -m pytest -q -m heavy

bench: $(STAMP)
	$(BIN)/python -m bench.engine_bench

schemas: $(STAMP)
	$(BIN)/python -m schemas.export

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build loopwarden_engine__mypyc*.so streams/engine/*.so streams/engine/compiled.json
