# The two quick-start commands. Both create ./.venv with the pinned CPU environment
# (requirements-cpu.txt) on first use and install srope into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.srope-installed

.PHONY: demo test test-inductor

$(STAMP): pyproject.toml requirements-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-cpu.txt -e '.[dev,lm]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/srope demo

# Two passes: Triton reads TRITON_INTERPRET when kernels are decorated, so the kernel tests
# (marked kernels, on the CPU through Triton's interpreter) run in a process of their own.
# What is skipped in either pass needs a CUDA GPU. The inductor compile tests (marked
# inductor: minutes per case on 2 cores) run in make test-inductor.
test: $(STAMP)
	@echo "== pass 1 of 2: everything but the Triton kernels and the inductor compiles (pytest -n 2)"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 -q -m "not kernels and not inductor" tests
	@echo "== pass 2 of 2: the Triton kernels under TRITON_INTERPRET=1"
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -m kernels tests

# Every host x position encoding compiled by inductor on the CPU (dense, padded, packed),
# against eager: see docs/testing.md for why it is a target of its own.
test-inductor: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 -q -m inductor tests
