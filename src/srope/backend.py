"""Which implementation srope's own kernels take: one setting for the whole library.

``"auto"`` (the default)
    srope's Triton kernels on CUDA tensors (the rotation, the angle generator's projection,
    gate and weights, the one-token decode step), PyTorch elsewhere.
``"torch"``
    PyTorch everywhere: the reference routes, for debugging and for comparisons.
``"triton"``
    srope's Triton kernels also for CPU tensors, under ``TRITON_INTERPRET=1`` (tests).

Set it for a block of code with :func:`use`::

    with srope.backend.use("torch"):
        loss = model(ids, labels=ids).loss

It is read where a call picks its route, so it holds for everything inside the block,
forward and backward. flash-linear-attention's pieces (the mixers, short convs, fused norms)
keep their own ``backend`` options (``auto`` | ``torch`` | ``fla``); ``"torch"`` here also
sends the position encodings' short conv to PyTorch. Public ops that take a ``backend``
argument (:func:`srope.ops.selective_rope`, :func:`srope.ops.rope`) follow the argument when
it is given and this setting when it is ``"auto"``.
"""

from __future__ import annotations

import contextlib
import os

BACKENDS = ("auto", "torch", "triton")
_active = "auto"  # changed only by use(); read where a call picks its route


def get() -> str:
    """The backend in effect."""
    return _active


def _check(backend) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"srope backend must be one of {BACKENDS}, got {backend!r}")
    return backend


@contextlib.contextmanager
def use(backend: str):
    """Run the block with ``backend`` (``"auto"``, ``"torch"`` or ``"triton"``); the previous
    setting comes back after it, also on an exception."""
    global _active
    previous, _active = _active, _check(backend)
    try:
        yield backend
    finally:
        _active = previous


def op_backend(requested: str = "auto") -> str:
    """What an op called with ``backend=requested`` runs: the request, unless it is
    ``"auto"``, then the setting in effect."""
    return _active if requested == "auto" else requested


def kernels(tensor) -> bool:
    """Whether srope's Triton kernels run for ``tensor``: on CUDA under ``"auto"``, always
    under ``"triton"`` (a CPU tensor then needs ``TRITON_INTERPRET=1``), never under
    ``"torch"``."""
    if _active == "auto":
        return tensor.is_cuda
    if _active == "torch":
        return False
    if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError("srope backend 'triton' on CPU tensors runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1 "
                         "before srope's kernels are imported, or use 'auto'/'torch'")
    return True
