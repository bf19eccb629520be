# One-command set-up: `make test` builds .venv from nothing, installs the system packages the tests need (or says
# which), and runs the suite; `make quickstart` runs the sample benchmark.
# .ci/constraints.txt pins the versions last tested together (pyproject stays open-ended for users).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.14.1 torchvision==0.29.1

.PHONY: venv test quickstart bench clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -c .ci/constraints.txt -e '.[test]'
	touch $@

venv: $(BIN)/.installed

test: venv
	.ci/system-packages
	$(BIN)/python -m pytest -q

quickstart: venv
	$(BIN)/cryocube quickstart --out quickstart-out

bench: venv
	$(BIN)/python benchmarks/run_all.py --short

clean:
	rm -rf $(VENV) quickstart-out
