VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test bench clean

$(PY): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(PY)

setup: $(PY)

demo: $(PY)
	$(PY) train.py experiment=demo
	$(PY) evaluate.py experiment=demo

test: $(PY)
	$(PY) -m pytest -n 2 tests

bench: $(PY)
	$(PY) benchmarks/table1.py

clean:
	rm -rf outputs multirun mlruns
