"""Input checks shared by the public ops: clear errors that say what was expected."""

from __future__ import annotations

import math
import weakref

import torch


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """max(float32, inputs): bf16/fp16 compute in float32, float64 stays float64."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def is_finite_number(value, *, positive: bool = True) -> bool:
    """A real, finite int or float (not a bool), > 0 (``positive``) or >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > 0 if positive else value >= 0


# The boundaries checked last, (weak reference, tensor version, length, N): a model passes one
# cu_seqlens tensor to every layer, op and encoding, and checking it costs a host sync each time.
_checked_cu_seqlens: tuple | None = None


def check_tensor(name: str, value, shape: tuple | None = None, *, rank: int | None = None, floating: bool = True) -> None:
    """``value`` is a tensor (floating unless told otherwise) with ``rank`` dimensions or of
    ``shape`` (None entries: any size)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if rank is not None and value.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(value.shape)}")
    if shape is not None and not (value.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, value.shape))):
        expected = ", ".join("?" if s is None else str(s) for s in shape)
        raise ValueError(f"{name} must have shape [{expected}], got {tuple(value.shape)}")


def check_device(device: torch.device, **tensors) -> None:
    """Every given tensor is on ``device`` (q's)."""
    for name, value in tensors.items():
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value is not None and value.device != device:
            raise ValueError(f"{name} is on {value.device} but q is on {device}; put all inputs on one device")


def check_backend(backend, allowed: tuple[str, ...]) -> None:
    if backend not in allowed:
        raise ValueError(f"backend must be one of {allowed}, got {backend!r}")


def check_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, length: int) -> int:
    """Validate packed-sequence boundaries; return the number of sequences N."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be a 1-D int32/int64 tensor [N+1] with N >= 1, got dtype "
            f"{cu_seqlens.dtype} and shape {tuple(cu_seqlens.shape)}"
        )
    if not cu_seqlens.is_contiguous():  # the kernels index it as a flat array
        raise ValueError("cu_seqlens must be contiguous: pass cu_seqlens.contiguous()")
    if batch != 1:
        raise ValueError(f"packed batches (cu_seqlens) need batch size 1, got {batch}")
    if torch.compiler.is_compiling():  # the host check below is a sync and a graph break: assert on the device
        ok = (cu_seqlens[0] == 0) & (cu_seqlens[-1] == length) & (cu_seqlens[1:] >= cu_seqlens[:-1]).all()
        torch._assert_async(ok, f"cu_seqlens must be non-decreasing, start at 0 and end at the sequence length {length}")
        return cu_seqlens.numel() - 1
    global _checked_cu_seqlens
    last = _checked_cu_seqlens
    if last is not None and last[0]() is cu_seqlens and last[1:3] == (cu_seqlens._version, length):
        return last[3]  # this very tensor, unchanged since (an in-place write bumps _version)
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != length or any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        raise ValueError(
            f"cu_seqlens must be non-decreasing, start at 0 and end at the sequence length {length}; "
            f"got {bounds if len(bounds) <= 12 else bounds[:6] + ['...'] + bounds[-3:]}"
        )
    _checked_cu_seqlens = (weakref.ref(cu_seqlens), cu_seqlens._version, length, len(bounds) - 1)
    return len(bounds) - 1
