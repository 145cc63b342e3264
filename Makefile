# Two commands: `make demo` and `make test`. Both create or reuse .venv and install everything themselves.
# torch is pinned to the CPU wheel on this path (an unpinned torch pulls a multi-GB CUDA build);
# constraints.txt pins every other package to the versions tested here (regenerate with `make freeze`).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed
RECIPE ?= pipelines/recipes/tiny-cpu.yaml
PYTEST_ARGS ?=

.PHONY: demo test install lint compile clean bench freeze

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[dev]' -c constraints.txt $(TORCH_PIN)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/posttrain validate $(RECIPE)
	$(BIN)/posttrain run $(RECIPE)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

compile: $(STAMP)
	$(BIN)/posttrain compile pipelines/recipes/tiny-cpu.yaml -o pipelines/kfp/posttrain.yaml --components components

bench: $(STAMP)
	$(BIN)/python benchmarks/rl_throughput.py

clean:
	rm -rf runs buckets mlruns mlflow.db pipeline_root local_outputs

freeze: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | grep -viE '^(torch|posttrain)==' > constraints.txt
