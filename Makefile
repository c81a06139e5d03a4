# The two quick-start commands. Both create ./.venv with the pinned CPU environment
# (requirements-cpu.txt) on first use and install srope into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.srope-installed

# PyPI's torch for Linux is the CUDA build (several GB more than the CPU one). On Linux without
# a CUDA GPU (no working nvidia-smi) torch comes from PyTorch's CPU index, whose 2.13.0+cpu
# satisfies requirements-cpu.txt's torch==2.13.0. TORCH_INDEX= (empty) keeps PyPI's build;
# TORCH_INDEX=URL names another index.
ifeq ($(shell uname -s),Linux)
ifeq ($(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu),)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
endif
endif

.PHONY: demo test test-inductor

# The pinned packages first (from TORCH_INDEX when set), then srope and its extras within the pins.
$(STAMP): pyproject.toml requirements-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-cpu.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -c requirements-cpu.txt -e '.[dev,lm]'
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
