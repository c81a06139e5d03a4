"""The host's elementwise pieces: RMSNorm (optionally with the residual add before it), the
gated RMSNorm of a mixer's output and SwiGLU.

On CUDA with flash-linear-attention installed each is one fla Triton kernel forward and one
backward, as fla's own models run them, instead of the four to ten PyTorch kernels of the
unfused expression (in float32 for the norms). Elsewhere, and while ``torch.compile`` traces
(inductor fuses the PyTorch expression itself), they are the PyTorch expression.

``backend``: ``"auto"`` (fla where it can run; for the norms only where
:func:`fla_norm_pays` says so; PyTorch under ``srope.backend.use("torch")``), ``"torch"`` or ``"fla"`` (raises where fla cannot run the
call). Under autocast, where fla fuses the residual add the normalised output
comes out in the dtype of ``x`` (the autocast dtype) rather than float32: the same values,
rounded once, as the linear map that reads them would round them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from srope.ops.mixers._common import check_backend, fla_dtype_problem, fla_ops, resolve_backend


# fla's norm kernels are compiled and autotuned once per ceil(rows / 2048) (a constexpr and an
# autotune key), and one autotune of the forward or backward takes tens of seconds on an H100.
# A large model trains at one shape and pays that once, for a kernel that then beats PyTorch's
# several; a small model whose length changes (the demo's curriculum, a sweep's widths) would
# stall at every new row count for kernels that save microseconds, and inference over many
# lengths (evaluation at every length to 512) would compile hundreds of variants. So "auto"
# takes fla's norms for gradient steps of at least FLA_NORM_MIN_ELEMENTS elements, and for
# inference calls of at most NORM_INFERENCE_MAX_ROWS rows (decode: one row block, one tuning).
NORM_INFERENCE_MAX_ROWS = 2048
FLA_NORM_MIN_ELEMENTS = 1 << 24  # a 64 MiB float32 call: gla-370m's training step is twice that


def fla_norm_pays(rows: int, width: int, grad: bool) -> bool:
    """Whether ``backend="auto"`` gives a norm call of ``rows`` × ``width`` to fla."""
    return rows * width >= FLA_NORM_MIN_ELEMENTS if grad else rows <= NORM_INFERENCE_MAX_ROWS


def _fla(backend: str, *tensors: torch.Tensor, norm: bool = False):
    """fla's ops when they should run this call, else None."""
    backend = check_backend(backend)
    if backend == "torch" or torch.compiler.is_compiling():
        return None
    x = tensors[0]
    if norm and backend == "auto" and not fla_norm_pays(x.numel() // max(x.shape[-1], 1), x.shape[-1], torch.is_grad_enabled()):
        return None
    if resolve_backend(backend, x.device, fla_dtype_problem(*tensors)) != "fla":
        return None
    return fla_ops()


def _eps(eps: float | None, x: torch.Tensor) -> float:
    return torch.finfo(x.dtype).eps if eps is None else eps  # F.rms_norm's default


def _check_weight(x: torch.Tensor, weight: torch.Tensor | None) -> None:
    if weight is not None and weight.shape != x.shape[-1:]:
        raise ValueError(f"weight must be [{x.shape[-1]}] for inputs of shape {tuple(x.shape)}, got {tuple(weight.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float | None = None, *, residual: torch.Tensor | None = None,
             backend: str = "auto"):
    """``rmsnorm(x) · weight`` over the last dimension; with ``residual``, ``(rmsnorm(s) ·
    weight, s)`` for ``s = residual + x`` (the pre-norm block's add, fused into the norm)."""
    _check_weight(x, weight)
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have the shape of x {tuple(x.shape)}, got {tuple(residual.shape)}")
    ops = _fla(backend, x, *(t for t in (weight, residual) if t is not None), norm=True)
    if ops is not None and residual is not None and _fusable_residual(x, residual):
        return ops.rms_norm(x, weight, None, residual=residual, eps=_eps(eps, x), prenorm=True)
    total = x if residual is None else residual + x
    if ops is not None:
        out = ops.rms_norm(total, weight, None, eps=_eps(eps, total))
    else:
        out = F.rms_norm(total, total.shape[-1:], weight, eps)
    return out if residual is None else (out, total)


def _fusable_residual(x: torch.Tensor, residual: torch.Tensor) -> bool:
    # fla keeps the sum in the residual's dtype: the sum PyTorch forms if that is the wider one
    # (float32 residual stream, autocast block output); the output takes x's dtype, which
    # outside autocast must then be the residual's too.
    if torch.promote_types(x.dtype, residual.dtype) != residual.dtype:
        return False
    return x.dtype == residual.dtype or torch.is_autocast_enabled(x.device.type)


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor | None, eps: float | None = None, *,
                   backend: str = "auto") -> torch.Tensor:
    """``rmsnorm(x) · weight · swish(gate)`` over the last dimension (fla's FusedRMSNormGated);
    ``gate=None``: the plain norm. The PyTorch path computes in at least the weight's dtype."""
    _check_weight(x, weight)
    if gate is not None and gate.shape != x.shape:
        raise ValueError(f"gate must have the shape of x {tuple(x.shape)}, got {tuple(gate.shape)}")
    ops = _fla(backend, x, *(t for t in (gate, weight) if t is not None), norm=True)
    if ops is not None:
        if gate is None:
            return ops.rms_norm(x, weight, None, eps=_eps(eps, x))
        return ops.rms_norm_gated(x, gate, weight, None, activation="swish", eps=_eps(eps, x))
    if weight is not None:
        x = x.to(torch.promote_types(x.dtype, weight.dtype))
    out = F.rms_norm(x, x.shape[-1:], weight, eps)
    return out if gate is None else out * F.silu(gate)


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """``silu(gate) · up`` (fla's fused SwiGLU on CUDA: one rounding instead of two)."""
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have one shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    ops = _fla(backend, gate, up)
    if ops is not None and gate.dtype == up.dtype:
        return ops.swiglu(gate, up)
    return F.silu(gate) * up
