# dpsyn — the commands a user runs (README). Everything runs inside .venv.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
FMNIST_DIR := /usr/share/datasets/fashion-mnist
PROFILE ?= embedded

.PHONY: install data test test-full wheel-check bench gpu-check gpu-check-wheels reproduce-tables docs docs-look clean

install: $(BIN)/python data
	# torch and torchvision pinned together: other pairs fail to import together (see README)
	$(BIN)/pip install torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -e '.[dev]'
	@echo "dpsyn installed. Activate with: source $(VENV)/bin/activate"

$(BIN)/python:
	$(PY) -m venv $(VENV)

# Fashion-MNIST (the embedded data of the default run and the tests) from Debian's package where apt exists.
data:
	@if ls $(FMNIST_DIR)/train-images-idx3-ubyte* >/dev/null 2>&1; then \
		echo "Fashion-MNIST found in $(FMNIST_DIR)"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -q dataset-fashion-mnist || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist)); \
	elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then \
		sudo apt-get install -y -q dataset-fashion-mnist; \
	else \
		echo "Fashion-MNIST not installed: put the four IDX files (train/t10k images/labels) in ./data/fashion-mnist,"; \
		echo "or install Debian's dataset-fashion-mnist package, or run with dataset.download=true where the network allows."; \
	fi

# the suite runs on every core (pytest-xdist; TEST_JOBS=1 runs it in one process)
TEST_JOBS ?= auto

test:
	$(BIN)/python -m pytest -m "not slow" -q -n $(TEST_JOBS)

test-full:
	$(BIN)/python -m pytest -q -n $(TEST_JOBS)

# A wheel of dpsyn installed (--no-deps) in a fresh venv runs the default config from outside the repository
# (tools/wheel-check; the dependencies come from $(VENV)). About half a minute; CI runs it after `make test`.
wheel-check:
	PY=$(BIN)/python bash tools/wheel-check

bench:
	$(BIN)/python benchmarks/dpsgd_step.py
	$(BIN)/python benchmarks/dib_step.py
	$(BIN)/python benchmarks/metrics_fidelity.py
	$(BIN)/python benchmarks/pe_histogram.py
	$(BIN)/python benchmarks/teachers.py
	$(BIN)/python benchmarks/gs_wgan_warm_start.py

# One short check of every method, paper profile and speed ratio on a GPU (benchmarks/gpu_check.py; exits 3 without
# CUDA). Writes gpu-check.json/.md into $OUT or here. A GPU machine without a venv uses its own python3.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	PYTHONPATH=$(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH)) $(GPU_PY) benchmarks/gpu_check.py

# The pure-Python wheels gpu-check needs on a machine that has torch, lightning, sklearn, scipy, torchmetrics and
# safetensors but not the rest (no network there), pinned as in the tested venv (antlr4 4.9.3 exists only as an
# sdist: the second download takes it): carried in .whl/, installed with
# pip install --no-index --no-deps --target /tmp/site .whl/*.whl, then PYTHONPATH=/tmp/site:. make gpu-check
GPU_WHEELS := hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 opacus==1.6.0 dp-accounting==0.6.0
gpu-check-wheels:
	$(BIN)/pip download --no-deps --only-binary=:all: -d .whl $(GPU_WHEELS) || \
		$(BIN)/pip download --no-deps -d .whl $(GPU_WHEELS)

# PROFILE=embedded|quick|paper|dib; DRY=1 lists the cells, the finished ones and the time the rest will take, runs nothing.
# After the sweeps: the runs' metrics go to experiments/<paper>/results.csv (kept in the repo), then the claims.
reproduce-tables:
ifdef DRY
	$(BIN)/python -m dpsyn.cli.tables reproduce --dry-run --profile $(PROFILE) $(if $(ONLY),--only $(ONLY))
else
	$(BIN)/python -m dpsyn.cli.tables reproduce --profile $(PROFILE) $(if $(LAUNCHER),--launcher $(LAUNCHER)) $(if $(ONLY),--only $(ONLY)); \
	rc=$$?; $(BIN)/python -m dpsyn.cli.tables export && $(BIN)/python -m dpsyn.cli.tables claims; exit $$rc
endif

# The generated tables of README.md and docs/ (methods, papers, claims, results, config, datasets), rebuilt from the
# registry, the schemas and experiments/*/results.csv; tests/test_docs.py fails when one is stale.
docs:
	$(BIN)/python -m dpsyn.methods.catalog
	$(BIN)/python -m dpsyn.cli.tables readme

# README and docs rendered to HTML (pandoc) and photographed in headless Chromium: outputs/docs-look/*.png
docs-look:
	bash tools/docs-look.sh

clean:
	rm -rf outputs .pytest_cache
