# The two quick-start commands. Both create ./.venv with the pinned CPU environment
# (requirements-cpu.txt) on first use and install srope into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.srope-installed

.PHONY: demo test

$(STAMP): pyproject.toml requirements-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-cpu.txt -e '.[dev,lm]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/srope demo

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 -q
	TRITON_INTERPRET=1 $(BIN)/python -m pytest tests/triton -q
