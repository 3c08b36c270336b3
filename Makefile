# dpsyn — the commands a user runs (README). Everything runs inside .venv.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
FMNIST_DIR := /usr/share/datasets/fashion-mnist
PROFILE ?= embedded

.PHONY: install data test test-full bench reproduce-tables clean

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

bench:
	$(BIN)/python benchmarks/dpsgd_step.py
	$(BIN)/python benchmarks/metrics_fidelity.py
	$(BIN)/python benchmarks/pe_histogram.py
	$(BIN)/python benchmarks/teachers.py

# PROFILE=embedded|quick|paper; DRY=1 lists the cells, the finished ones and the time the rest will take, runs nothing.
# After the sweeps: the runs' metrics go to experiments/<paper>/results.csv (kept in the repo), then the claims.
reproduce-tables:
ifdef DRY
	$(BIN)/python -m dpsyn.cli.tables reproduce --dry-run --profile $(PROFILE) $(if $(ONLY),--only $(ONLY))
else
	$(BIN)/python -m dpsyn.cli.tables reproduce --profile $(PROFILE) $(if $(LAUNCHER),--launcher $(LAUNCHER)) $(if $(ONLY),--only $(ONLY)); \
	rc=$$?; $(BIN)/python -m dpsyn.cli.tables export && $(BIN)/python -m dpsyn.cli.tables claims; exit $$rc
endif

clean:
	rm -rf outputs .pytest_cache
