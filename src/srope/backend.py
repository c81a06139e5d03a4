"""Which implementation srope runs: one setting for the whole library.

Two families of Triton kernels sit behind srope's PyTorch reference routes: srope's own
(the rotation, the angle generator's projection, gate and weights, the one-token decode
step) and flash-linear-attention's pieces (the mixers, the short convs, the fused norms and
SwiGLU). The setting picks among them:

``"auto"`` (the default)
    both families on CUDA tensors, PyTorch elsewhere.
``"torch"``
    PyTorch everywhere: the reference routes, for debugging and for comparisons.
``"fla"``
    fla's pieces on CUDA tensors, srope's own kernels nowhere: what srope's kernels save, or
    ruling them out, with the rest of the model at full speed.
``"triton"``
    srope's kernels also for CPU tensors, under ``TRITON_INTERPRET=1`` (tests); fla's pieces
    as under ``"auto"`` (they never run on the CPU).

Set it for a block of code with :func:`use`::

    with srope.backend.use("torch"):
        loss = model(ids, labels=ids).loss

It is read where a call picks its route, so it holds for everything inside the block,
forward and backward. Public ops that take a ``backend`` argument (the rotation ops, the
mixers, the fused pieces, the short conv) follow the argument when it is given and this
setting when it is ``"auto"``. The table of every switch: docs/kernels.md.
"""

from __future__ import annotations

import contextlib
import os

BACKENDS = ("auto", "torch", "fla", "triton")
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
    """Run the block with ``backend`` (one of :data:`BACKENDS`); the previous setting comes
    back after it, also on an exception."""
    global _active
    previous, _active = _active, _check(backend)
    try:
        yield backend
    finally:
        _active = previous


def op_backend(requested: str = "auto") -> str:
    """What one of srope's own ops called with ``backend=requested`` runs (``"auto"``,
    ``"torch"`` or ``"triton"``): the request, unless it is ``"auto"``, then the setting in
    effect (``"fla"`` leaves srope's kernels out: ``"torch"``)."""
    if requested != "auto":
        return requested
    return "torch" if _active == "fla" else _active


def fla_backend(requested: str = "auto") -> str:
    """What one of fla's pieces called with ``backend=requested`` runs (``"auto"``,
    ``"torch"`` or ``"fla"``): the request, unless it is ``"auto"`` under ``"torch"``."""
    return "torch" if requested == "auto" and _active == "torch" else requested


def kernels(tensor) -> bool:
    """Whether srope's Triton kernels run for ``tensor``: on CUDA under ``"auto"``, always
    under ``"triton"`` (a CPU tensor then needs ``TRITON_INTERPRET=1``), never under
    ``"torch"`` or ``"fla"``."""
    if _active == "auto":
        return tensor.is_cuda
    if _active in ("torch", "fla"):
        return False
    if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError("srope backend 'triton' on CPU tensors runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1 "
                         "before srope's kernels are imported, or use 'auto'/'torch'")
    return True
