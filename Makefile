VENV ?= .venv
PY := $(VENV)/bin/python

SERVER_LOG := $(VENV)/llama-cpp-python-build.log
LLAMA_WHEELS := $(VENV)/llama-wheel
# the version pyproject.toml's group [server] pins; its wheel is built while the rest installs (the build is CPU, the
# install mostly downloads)
LLAMA_VERSION := $(shell sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
# llama.cpp for the CPU it is built on, whatever its features: no -march=native (its AVX-512/AMX kernels crashed the
# server on such a CPU), AVX2/FMA/F16C kernels only where the CPU has them. --no-cache-dir: pip would reuse a wheel
# built with other flags. LLAVA_BUILD=OFF: the multimodal library (mtmd), which the text-only server never loads. docs/setup.md
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
	$(if $(filter avx2,$(CPU_FLAGS)),,-DGGML_AVX2=OFF -DGGML_BMI2=OFF) $(if $(filter fma,$(CPU_FLAGS)),,-DGGML_FMA=OFF) \
	$(if $(filter f16c,$(CPU_FLAGS)),,-DGGML_F16C=OFF) $(if $(filter avx,$(CPU_FLAGS)),,-DGGML_AVX=OFF)

.PHONY: setup demo demo-llm test test-fast bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	@echo "installing the package; building llama-cpp-python $(LLAMA_VERSION) (the optional group [server]) from source beside it, portable: $(LLAMA_CMAKE_ARGS) (a few minutes on 2 cores)"
	@rm -rf $(LLAMA_WHEELS); (CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip wheel --no-deps --no-cache-dir \
		-w $(LLAMA_WHEELS) "llama-cpp-python==$(LLAMA_VERSION)" > $(SERVER_LOG) 2>&1; echo $$? > $(LLAMA_WHEELS).rc) & \
	$(PY) -m pip install -qq -e ".[test]"; status=$$?; wait; exit $$status
	@if [ "$$(cat $(LLAMA_WHEELS).rc)" = 0 ] && $(PY) -m pip install -qq "$$(ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl)[server]" -e ".[test,server]" >> $(SERVER_LOG) 2>&1; \
	then rm -rf $(SERVER_LOG) $(LLAMA_WHEELS) $(LLAMA_WHEELS).rc; \
	else echo "setup: the optional group [server] (llama-cpp-python) did not install, see $(SERVER_LOG); its tests will skip"; fi
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

test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n 2 --dist loadgroup -p no:cacheprovider tests

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
