VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo demo-llm test test-fast bench clean

# the package with its test tools and llama.cpp's server (the optional group [server]: the prebuilt xllamacpp wheel,
# no compiler; docs/setup.md), installed by uv (its wheel; pip's folder of local wheels, PIP_FIND_LINKS, passed on),
# or by pip where uv cannot be installed or fails; both write the packages' bytecode (.pyc) at install time, so that no
# process compiles torch's or mlflow's sources again where PYTHONDONTWRITEBYTECODE is set (train.py's imports with
# torch._dynamo and mlflow: 18 CPU-s without, 6-8 with them)
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	@if $(PY) -m pip install -qq uv 2>/dev/null; then \
		UV_FIND_LINKS="$${UV_FIND_LINKS:-$$PIP_FIND_LINKS}" $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e ".[test,server]" \
		|| { echo "setup: uv failed, installing with pip"; $(PY) -m pip install -qq -e ".[test,server]"; }; \
	else $(PY) -m pip install -qq -e ".[test,server]"; fi
	touch $@

setup: $(VENV)/.installed
	$(VENV)/bin/llmrubric models fetch smollm2 models
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (headless browser check of the HTML report; a minute or two)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) > $(VENV)/apt-chromium.log 2>&1 \
		&& rm -f $(VENV)/apt-chromium.log \
		|| echo "setup: chromium did not install, see $(VENV)/apt-chromium.log; its test will skip"; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing postgresql (the PostgreSQL study tests start a local server; a minute or two)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) > $(VENV)/apt-postgresql.log 2>&1 \
		&& rm -f $(VENV)/apt-postgresql.log \
		|| echo "setup: postgresql did not install, see $(VENV)/apt-postgresql.log; its tests will skip"; \
	fi

demo: setup
	$(PY) train.py experiment=demo
	$(PY) evaluate.py experiment=demo

# SmolLM2 on the texts of data/demo_llm/, a calibrator trained on the real LLM-Rubric annotations of its features,
# then scores and a leaderboard of the new texts (docs: data/demo_llm/README.md)
DEMO_LLM := outputs/demo_llm
demo-llm: setup
	$(VENV)/bin/llmrubric extract features data/demo_llm/texts.csv --config conf/extract/smollm2.yaml \
		--out $(DEMO_LLM)/new_texts/features.csv --no-progress
	$(PY) train.py experiment=demo_llm
	$(PY) evaluate.py experiment=demo_llm
	$(VENV)/bin/llmrubric score texts $(DEMO_LLM)/fold0.safetensors $(DEMO_LLM)/new_texts/features.csv \
		--texts data/demo_llm/texts.csv --out $(DEMO_LLM)/new_texts/scores.csv \
		--predictions $(DEMO_LLM)/new_texts/predictions.csv --no-progress
	$(VENV)/bin/llmrubric leaderboard build $(DEMO_LLM)/new_texts/predictions.csv --texts data/demo_llm/texts.csv \
		--out-dir $(DEMO_LLM)/new_texts/leaderboard
	@echo "features of the new texts:    $(DEMO_LLM)/new_texts/features.csv (+ .failures.csv, .summary.json)"
	@echo "calibrator and its metrics:   $(DEMO_LLM)/fold0.safetensors, $(DEMO_LLM)/metrics.md (held-out real dialogues)"
	@echo "scores of the new texts:      $(DEMO_LLM)/new_texts/scores.csv, predictions.csv"
	@echo "leaderboard of their systems: $(DEMO_LLM)/new_texts/leaderboard/"

# setup, then the lint and the whole suite; the last line says how long each part took
test:
	@start=$$(date +%s); $(MAKE) --no-print-directory setup || exit $$?; ready=$$(date +%s); \
	$(PY) -m ruff check . && $(PY) -m ruff format --check . && \
	$(PY) -m pytest -n 2 --dist loadgroup -p no:cacheprovider tests; status=$$?; \
	echo "make test: setup $$((ready - start)) s, tests $$(($$(date +%s) - ready)) s (exit $$status)"; exit $$status

# the tests without the slow and service-backed markers of pyproject.toml (about a minute on 2 cores); no `make setup`
FAST_TESTS := not slow and not llm and not llama_server and not postgres and not mlflow_server and not chromium
test-fast: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n 2 --dist loadgroup -p no:cacheprovider -q -m "$(FAST_TESTS)" tests

bench: setup
	$(PY) benchmarks/table1.py

clean:
	rm -rf outputs multirun mlruns
