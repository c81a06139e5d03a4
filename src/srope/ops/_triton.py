"""What every srope Triton kernel's launch shares: whether Triton interprets on the CPU,
programmatic dependent launch on sm_90+, and the device the launch runs on.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


PDL_ENV = "SROPE_PDL"


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl(x: torch.Tensor) -> dict:
    """Launch options for programmatic dependent launch of srope's kernels on ``x``'s device:
    ``{"PDL": True, "launch_pdl": True}`` on sm_90+ GPUs, else none (CPU, the interpreter,
    older GPUs, or ``SROPE_PDL=0`` in the environment, read at every launch).

    The two always go together: a kernel launched early (``launch_pdl``) must wait for its
    predecessor before reading (``PDL``, :func:`await_predecessor`). What it saves
    is the gap between dependent kernels, the next one's programs being resident when the
    previous one ends (a few microseconds per kernel; it matters most for short kernels
    and CUDA-graph replays)."""
    if x.device.type != "cuda" or interpreting() or os.environ.get(PDL_ENV, "1") == "0":
        return {}
    return {"PDL": True, "launch_pdl": True} if _pdl_capable(x.device.index) else {}


def on_device(x: torch.Tensor):
    """Launch on ``x``'s GPU whatever the current device is."""
    return torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext()


@triton.jit
def await_predecessor(PDL: tl.constexpr):
    """With programmatic dependent launch: wait for the previous kernel in the stream to
    finish (its writes visible), then allow the next kernel to launch. Called first, before
    any load: the previous kernel may have written any input."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
