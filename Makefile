# Two entry points a newcomer needs: `make run` (the embedded default job) and `make test`.
# Both create .venv on first use. torch is installed first and pinned to the CPU build this
# platform provides, so no multi-GB CUDA build is pulled in.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint venv clean

$(BIN)/asyncrl: pyproject.toml setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/asyncrl

venv: $(BIN)/asyncrl

run: venv
	$(BIN)/asyncrl run

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy api trainer rollout

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
