"""What every srope Triton kernel's launch shares: whether Triton interprets on the CPU,
programmatic dependent launch on sm_90+, the device the launch runs on, the registration of
launch functions as ``torch.library`` ops (:class:`KernelOp`), and host-side integer helpers.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable
from torch.overrides import has_torch_function
from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


# Triton reads the flag when it decorates a kernel, on import: read here once too (a launch
# asks several times, and an environment lookup is a Python call).
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    """True when Triton runs the kernels in its CPU interpreter (``TRITON_INTERPRET=1`` when
    they were imported)."""
    return _INTERPRETING


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


# Host code sizes its launches with these rather than triton.cdiv / triton.next_power_of_2:
# Triton 3.6 made those constexpr functions, about 3 µs a call from Python, and a training
# step's launches make dozens of such calls.
def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` for ``n >= 1`` (0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


class KernelOp:
    """A launch function (tensors in, fresh tensors out) that ``torch.compile`` sees as the
    ``torch.library`` custom op ``name`` and eager code calls directly.

    The custom op is what keeps compiled graphs whole (its fake implementation gives the
    shapes; its autograd formula is traced into the backward graph). Eager, the same launches
    go without the dispatcher: a custom op with autograd costs a few tens of microseconds of
    host time per call each way, which an eager step of many small kernels pays in full.
    With :meth:`register_autograd`, the eager route is a ``torch.autograd.Function`` built
    from the same ``setup_context`` and backward: one formula for both routes, whose backward
    (traced by ``torch.compile`` through the op, run eagerly through the Function) reaches
    other KernelOps, which route themselves the same way. An op without autograd called on
    inputs that require gradients also takes the op, whose outputs then refuse a backward as
    before (rather than silently carrying none). The op itself is ``.op`` (what
    ``torch.library.opcheck`` takes).
    """

    def __init__(self, name: str, fn):
        self.fn = fn
        self.op = torch.library.custom_op(name, mutates_args=())(fn)
        self._direct = None  # the Function's apply, with register_autograd
        self._signature = inspect.signature(fn)
        self._arity = len(self._signature.parameters)
        functools.update_wrapper(self, fn)

    def register_fake(self, fake):
        self.op.register_fake(fake)
        return fake

    def register_autograd(self, backward, *, setup_context) -> None:
        self.op.register_autograd(backward, setup_context=setup_context)
        fn = self.fn

        def forward(ctx, *args):
            # (setup here, not as a separate setup_context: Function.apply binds that one's
            # arguments through inspect.signature on every call)
            output = fn(*args)
            setup_context(ctx, args, output)
            return output

        @once_differentiable  # the backward launches kernels: no graph of its own, as the op's
        def direct_backward(ctx, *grads):
            return backward(ctx, *grads)

        # named after the launch function, so that profiles and grad_fn say which op it is
        Direct = type(fn.__name__.strip("_"), (torch.autograd.Function,),
                      {"forward": staticmethod(forward), "backward": staticmethod(direct_backward)})
        self._direct = Direct.apply

    def __call__(self, *args, **kwargs):
        if _traced(args, kwargs):
            return self.op(*args, **kwargs)
        if self._direct is None:
            if torch.is_grad_enabled() and torch._C._any_requires_grad(*args, *kwargs.values()):
                return self.op(*args, **kwargs)
            return self.fn(*args, **kwargs)
        if kwargs or len(args) < self._arity:  # the setup sees every argument, as the op's does
            bound = self._signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args = bound.args
        return self._direct(*args)


def _traced(args, kwargs) -> bool:
    """Whether a call is being traced rather than run: under ``torch.compile`` or ``export``,
    ``torch.jit.trace``, inside a dispatch mode (``make_fx``, ``aot_function``, ``opcheck``, a
    FLOP counter), on objects that take part in ``__torch_function__`` (``torch.fx`` proxies),
    or on tensor subclasses (fake, functional, DTensor). Those must see the op."""
    if torch.compiler.is_compiling() or _dispatch_mode() is not None or torch.jit.is_tracing():
        return True
    values = (*args, *kwargs.values()) if kwargs else args
    if has_torch_function(values):
        return True
    return any(isinstance(a, torch.Tensor) and type(a) is not torch.Tensor and type(a) is not torch.nn.Parameter for a in values)


def kernel_op(name: str):
    """Decorator form of :class:`KernelOp`."""
    return lambda fn: KernelOp(name, fn)
