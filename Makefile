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

# Two passes: Triton reads TRITON_INTERPRET when kernels are decorated, so the kernel tests
# (marked kernels, on the CPU through Triton's interpreter) run in a process of their own.
# What is skipped in either pass needs a CUDA GPU.
test: $(STAMP)
	@echo "== pass 1 of 2: everything but the Triton kernels (pytest -n 2)"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 -q -m "not kernels" tests
	@echo "== pass 2 of 2: the Triton kernels under TRITON_INTERPRET=1"
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -m kernels tests
