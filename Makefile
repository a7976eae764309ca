VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed
	$(VENV)/bin/llmrubric models fetch smollm2 models
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (headless browser check of the HTML report)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing postgresql (the PostgreSQL study tests start a local server)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	fi

demo: setup
	$(PY) train.py experiment=demo
	$(PY) evaluate.py experiment=demo

test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n 2 -p no:cacheprovider tests

bench: setup
	$(PY) benchmarks/table1.py

clean:
	rm -rf outputs multirun mlruns
