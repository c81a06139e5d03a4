"""Shared plumbing of the mixer ops: input checks, backend choice, the lazy fla import.

flash-linear-attention (fla) is imported only when a CUDA tensor asks for it, so the CPU
install never needs it (nor Triton).
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from types import SimpleNamespace

import torch

from srope import backend as srope_backend
from srope.ops.checks import check_backend as _check_backend
from srope.ops.checks import check_cu_seqlens, check_tensor  # noqa: F401  (re-exported for the mixers)
from srope.ops.checks import check_device as check_same_device  # noqa: F401


MIXER_BACKENDS = ("auto", "torch", "fla")
FLA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FLA_MAX_HEAD_DIM = 256  # fla's attention and delta-rule kernels hold one head in one block
FUSED_RECURRENT_MAX_T = 64  # fla's layers switch to the fused recurrent kernels at T <= 64

_warned: set[str] = set()


def host_constant(fn):
    """``torch.compiler.assume_constant_result``: torch.compile calls ``fn`` on the host while it
    traces and keeps its result as a constant. Set here as the mark torch's decorator sets
    (``tests/test_imports.py`` holds the two equal), because torch's imports
    ``torch._dynamo``, about a second of every process's start, for programs that never compile."""
    fn._dynamo_marked_constant = True
    return fn


@host_constant
def warn_once(key: str, message: str) -> None:
    """Issue ``message`` once per process (``key`` identifies it). Under torch.compile it runs
    on the host while tracing (dynamo cannot trace ``warnings.warn``: a graph break at
    every call that warns, as Gated DeltaNet's #640 warning did on the H200)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------


def check_backend(backend) -> str:
    """What a call with ``backend`` runs: the argument, or under ``"auto"`` what
    :mod:`srope.backend` sets (``"torch"`` there keeps fla out)."""
    _check_backend(backend, MIXER_BACKENDS)
    return srope_backend.fla_backend(backend)


def check_scale(scale, default: float) -> float:
    if scale is None:
        return default
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_rank4(name: str, value) -> tuple[int, int, int, int]:
    check_tensor(name, value)
    if value.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions [B, T, H, D], got shape {tuple(value.shape)}")
    if value.shape[1] < 1:
        raise ValueError(f"{name} must have at least one time step (T >= 1), got shape {tuple(value.shape)}")
    return tuple(value.shape)


def sequence_count(cu_seqlens, batch: int, length: int) -> int:
    """N: the batch size, or the number of packed sequences (validates ``cu_seqlens``)."""
    return batch if cu_seqlens is None else check_cu_seqlens(cu_seqlens, batch, length)


def check_state(initial_state, count: int, heads: int, key_dim: int, value_dim: int) -> None:
    if initial_state is not None:
        check_tensor("initial_state", initial_state, (count, heads, key_dim, value_dim))


def needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# ----------------------------------------------------------------------------------------
# fla, lazily
# ----------------------------------------------------------------------------------------


_FLA: tuple[SimpleNamespace | None, str | None] | None = None  # (fla's kernels or None, why not) once imported


def _load_fla() -> tuple[SimpleNamespace | None, str | None]:
    # A module global rather than functools.cache: torch.compile reads a global, but traces
    # through a cache wrapper into the imports (a graph break at every call).
    global _FLA
    if _FLA is None:
        _FLA = _import_fla()
    return _FLA


def _import_fla() -> tuple[SimpleNamespace | None, str | None]:
    try:
        from fla.ops.attn import parallel_attn
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
        from fla.ops.forgetting_attn import parallel_forgetting_attn
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        from fla.ops.gla import chunk_gla, fused_recurrent_gla
        from fla.modules.activations import swiglu
        from fla.modules.causal_conv1d import causal_conv1d
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
        from fla.modules.norm.layernorm import rms_norm
    except Exception as error:  # ImportError, or fla failing to initialise on this machine
        return None, f"{type(error).__name__}: {error}"
    return SimpleNamespace(**{f.__name__: f for f in (
        chunk_gla, fused_recurrent_gla, chunk_gated_delta_rule, fused_recurrent_gated_delta_rule,
        chunk_delta_rule, fused_recurrent_delta_rule, parallel_forgetting_attn, parallel_attn, causal_conv1d,
        rms_norm, rms_norm_gated,
    )}, swiglu=swiglu), None  # fmt: skip


@host_constant  # the import runs on the host, also when a compiled call comes first
def _fla_importable() -> bool:
    return _load_fla()[0] is not None


def fla_ops() -> SimpleNamespace | None:
    """fla's kernels (imported on first use), or None when fla cannot be imported."""
    return _load_fla()[0] if _fla_importable() else None


def fla_available() -> bool:
    return fla_ops() is not None


@host_constant  # host-side: torch.compile evaluates it once per trace
def resolve_backend(backend: str, device: torch.device, not_applicable: str | None = None) -> str:
    """``"fla"`` or ``"torch"`` for this call.

    ``not_applicable`` says why fla cannot run this particular call (None: it can).
    ``"auto"`` quietly takes the torch path then; ``"fla"`` raises.
    """
    if backend == "torch":
        return "torch"
    if device.type != "cuda":
        if backend == "fla":
            raise ValueError(f"backend='fla' needs CUDA tensors, got tensors on {device}")
        return "torch"
    if not_applicable is not None:
        if backend == "fla":
            raise ValueError(f"backend='fla' cannot run this call: {not_applicable}")
        return "torch"
    ops, error = _load_fla()
    if ops is None:
        if backend == "fla":
            raise ImportError(
                "backend='fla' needs flash-linear-attention 0.6.0 (pip install 'srope[cuda]'); "
                f"importing it failed with {error}"
            )
        warn_once(
            "fla-missing",
            f"flash-linear-attention is not importable ({error}); srope's mixers use their "
            "PyTorch paths on CUDA, which are much slower",
        )
        return "torch"
    return "fla"


def fla_dtype_problem(*tensors: torch.Tensor) -> str | None:
    for t in tensors:
        if t is not None and t.dtype not in FLA_DTYPES:
            return f"fla's kernels take float16/bfloat16/float32, got {t.dtype}"
    return None


# ----------------------------------------------------------------------------------------
# The Hopper + Triton 3.4–3.7.0 problem (fla issue #640)
# ----------------------------------------------------------------------------------------


def _version_tuple(version: str) -> tuple[int, int, int]:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return (0, 0, 0)
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def gated_backward_broken_for(capability: tuple[int, int], device_name: str, triton_version: str | None) -> bool:
    """fla 0.6.0's guard in ``chunk_bwd_dqkwg``: a Hopper GPU (capability 9.x, or a name
    starting "NVIDIA H", as fla tests) with 3.4.0 <= Triton < 3.7.1."""
    if triton_version is None:
        return False
    hopper = capability[0] == 9 or "NVIDIA H" in device_name
    return hopper and (3, 4, 0) <= _version_tuple(triton_version) < (3, 7, 1)


@host_constant
def fla_gated_backward_is_broken(device: torch.device | str | int | None = None) -> bool:
    """True where fla's gated chunk backward (``chunk_gated_delta_rule``) refuses to run
    because it would compute wrong gradients (fla #640): Hopper GPUs with
    3.4.0 <= Triton < 3.7.1. False without CUDA or without Triton.

    We treat the condition as broken even if tilelang is installed (fla's alternative
    backend for this kernel), because that backend rejects some dtype combinations.
    """
    if not torch.cuda.is_available():
        return False
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type != "cuda":
        return False
    return _broken_on(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _broken_on(index: int) -> bool:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        return False
    return gated_backward_broken_for(
        torch.cuda.get_device_capability(index), torch.cuda.get_device_name(index), triton_version
    )


# ----------------------------------------------------------------------------------------
# Chunked layout for the torch paths
# ----------------------------------------------------------------------------------------


def no_autocast(device: torch.device):
    """The PyTorch paths compute in the dtype they choose, also inside an autocast region."""
    return torch.autocast(device_type=device.type, enabled=False)


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[B, T, H, *rest]`` → ``[B, H, NC, C, *rest]``, zero-padding T to a multiple of C.

    Zero padding at the end is harmless for the linear recurrences: a step with k = v = 0,
    beta = 0 and log-decay 0 leaves the state unchanged.
    """
    batch, length, heads = x.shape[:3]
    rest = x.shape[3:]
    pad = (-length) % chunk_size
    if pad:
        x = torch.cat([x, x.new_zeros(batch, pad, heads, *rest)], dim=1)
    x = x.reshape(batch, (length + pad) // chunk_size, chunk_size, heads, *rest)
    return x.movedim(3, 1)


def from_chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """Inverse of :func:`to_chunks`: ``[B, H, NC, C, *rest]`` → ``[B, T, H, *rest]``."""
    batch, heads, chunks, chunk_size = x.shape[:4]
    x = x.movedim(1, 3).reshape(batch, chunks * chunk_size, heads, *x.shape[4:])
    return x[:, :length]


def causal_mask(size: int, device: torch.device, *, strict: bool = False) -> torch.Tensor:
    """``[C, C]`` bool, True where key s may reach query t: s <= t (s < t when strict)."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril(-1 if strict else 0)


def without_empty_sequences(cu_seqlens, initial_state):
    """Drop empty packed sequences before an fla call (their kernels are not specified for
    them). Returns ``(cu_seqlens, initial_state, restore)``; ``restore(final_state)`` puts
    the dropped sequences back with their state unchanged (the initial state, or zeros)."""
    if cu_seqlens is None:
        return cu_seqlens, initial_state, lambda final: final
    nonempty = cu_seqlens[1:] > cu_seqlens[:-1]
    if bool(nonempty.all()):
        return cu_seqlens, initial_state, lambda final: final
    kept = torch.cat([cu_seqlens[:1], cu_seqlens[1:][nonempty]])
    state = None if initial_state is None else initial_state[nonempty]

    def restore(final):
        if final is None:
            return None
        full = final.new_zeros(nonempty.shape[0], *final.shape[1:]) if initial_state is None else initial_state.to(final.dtype)
        return full.index_put((nonempty.nonzero().squeeze(1),), final)

    return kept, state, restore
