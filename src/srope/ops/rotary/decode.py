"""One-token decoding step of Selective RoPE, fused into one Triton kernel.

Given the ω projection ``u`` of the new token, the step does what
``SelectiveRoPE.phase_increments`` followed by the rotation op do for one token, in the
same order and with the same roundings to the generator's dtype:

    window = [conv_state, u]            (the last W inputs)
    y      = act(Σ_w weight[:, w] · window[:, w] + conv_bias)
    φ      = (y + exp(b)) · gate
    Φ      = phase + φ                  (float64)
    q, k   rotated by wrap(Θ · Φ)

and returns the rotated q, k and the new state ``(window[:, 1:], Φ)``. For a full-rank ω
map with a per-head (or no) gate the same kernel can also compute u and the gate from the
token x first (:func:`_token_inputs`), so that a decoding step of the module is one launch
per layer. Inference only: there is no backward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srope.ops._triton import await_predecessor, interpreting, kernel_op, next_power_of_2, on_device, pdl
from srope.ops.conv import ACTIVATIONS
from srope.ops.rotary.kernels import _exp, _load_halves, _out, _rotate_heads_fwd, _sincos, _wrap

GATE_NONE, GATE_HEAD, GATE_CHANNEL = 0, 1, 2


@triton.jit
def _round(x, ptr, CD: tl.constexpr):
    """Round ``x`` to ``ptr``'s element type and back (the torch path's intermediate rounding)."""
    return _out(x, ptr).to(CD)


@triton.jit
def decode_step_kernel(
    q, k, u, state, weight, conv_bias, log_bias, gate, phase, temp,
    q_out, k_out, state_out, phase_out,
    x, first, gate_bias, eps,
    q_n, q_h, k_n, k_h, u_n, s_n, s_c, g_n, temp_h, x_n,
    Hk: tl.constexpr, G: tl.constexpr, R: tl.constexpr, P: tl.constexpr, W: tl.constexpr,
    BR: tl.constexpr, BP: tl.constexpr, BW: tl.constexpr,
    SILU: tl.constexpr, HAS_CONV_BIAS: tl.constexpr, HAS_BIAS: tl.constexpr, GATE: tl.constexpr,
    F64: tl.constexpr, PRECISE: tl.constexpr,
    FROM_X: tl.constexpr = False, I: tl.constexpr = 1, M: tl.constexpr = 1, BH: tl.constexpr = 1, BI: tl.constexpr = 1,
    X64: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """One program per (sequence n, key head hk): its R generator channels, then the
    rotation of key head hk and its query-head group. With ``FROM_X`` the channels' inputs
    (u, and the per-head gate) come from the token x and the first layers ``first`` here
    (:func:`_token_inputs`, rounded as the two-kernel path stores them; ``u`` is then only
    the generator's dtype) instead of from memory."""
    await_predecessor(PDL)
    CD: tl.constexpr = tl.float64 if F64 else tl.float32
    n, hk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    rr = tl.arange(0, BR)
    mr = rr < R
    ww = tl.arange(0, BW)
    channel = hk * R + rr
    if FROM_X:
        z, token_gate = _token_inputs(x, first, gate_bias, eps, n, hk, x_n, Hk, I, R, M, BH, BI, BR, GATE == 1, X64)
        new = z.to(u.dtype.element_ty)
    else:
        new = tl.load(u + n * u_n + channel, mask=mr, other=0.0)
    m_hist = mr[:, None] & (ww < W - 1)[None, :]
    row = state + n * s_n + channel[:, None] * s_c
    history = tl.load(row + ww[None, :], mask=m_hist, other=0.0).to(CD)
    window = tl.where(ww[None, :] == W - 1, new.to(CD)[:, None], history)
    taps = _round(tl.load(weight + channel[:, None] * W + ww[None, :], mask=mr[:, None] & (ww < W)[None, :], other=0.0), u, CD)
    y = tl.sum(window * taps, 1)
    if HAS_CONV_BIAS:
        y += _round(tl.load(conv_bias + channel, mask=mr, other=0.0), u, CD)
    y = _round(y, u, CD)
    if SILU:
        y = _round(y / (1.0 + _exp(-y, PRECISE)), u, CD)
    if HAS_BIAS:
        b = tl.load(log_bias + channel, mask=mr, other=0.0).to(CD)
        y = _round(y + _round(_exp(b, PRECISE), u, CD), u, CD)
    if GATE == 1:
        if FROM_X:
            y = _round(y * token_gate.to(u.dtype.element_ty).to(CD), u, CD)
        else:
            y = _round(y * tl.load(gate + n * g_n + hk).to(CD), u, CD)
    if GATE == 2:
        y = _round(y * tl.load(gate + n * g_n + channel, mask=mr, other=0.0).to(CD), u, CD)
    # The new conv state: the window shifted by one (inputs 1 .. W-1).
    shifted = tl.load(row + ww[None, :] + 1, mask=mr[:, None] & (ww + 1 < W - 1)[None, :], other=0.0)
    shifted = tl.where(ww[None, :] == W - 2, new[:, None], shifted)
    tl.store(state_out + n * s_n + channel[:, None] * s_c + ww[None, :], shifted, mask=m_hist)
    slot = (n * Hk + hk) * R + rr
    total = tl.load(phase + slot, mask=mr, other=0.0) + y.to(tl.float64)
    tl.store(phase_out + slot, total, mask=mr)
    theta = tl.load(temp + hk * temp_h + rr, mask=mr, other=0.0).to(tl.float64)
    cos, sin = _sincos(_wrap(theta * total).to(CD)[None, :], PRECISE)  # [1, BR]
    t = tl.zeros([1], dtype=tl.int64)
    mt = t == 0
    m = mt[:, None] & mr[None, :]
    q1, q2 = _load_halves(q, q_n, 0, q_h, n, t, hk * G, rr, m, R, CD)
    k1, k2 = _load_halves(k, k_n, 0, k_h, n, t, hk, rr, m, R, CD)
    _rotate_heads_fwd(q, q_out, q_n, 0, q_h, q_n, 0, q_h, n, t, mt, hk * G, G, cos, sin, rr, mr, q1, q2, R, P, BP, CD)
    _rotate_heads_fwd(k, k_out, k_n, 0, k_h, k_n, 0, k_h, n, t, mt, hk, 1, cos, sin, rr, mr, k1, k2, R, P, BP, CD)


@triton.jit
def _token_inputs(
    x, weight, gate_bias, eps, n, hk, x_n,
    Hk: tl.constexpr, I: tl.constexpr, R: tl.constexpr, M: tl.constexpr,
    BH: tl.constexpr, BI: tl.constexpr, BR: tl.constexpr, GATE: tl.constexpr, F64: tl.constexpr,
):
    """Token n's generator inputs for key head hk: ``u = x̂_hk @ weight[hk, :, :R]`` ([BR],
    unrounded) and, with a per-head gate, ``sigmoid(Σ_h x̂_h @ weight[h, :, R + hk] +
    gate_bias[hk])`` (else 0); x̂_h = x_h / sqrt(|x_h|² + ε) for each head chunk x_h of the
    token (the loop walks the hidden size in BI-wide slices)."""
    CD: tl.constexpr = tl.float64 if F64 else tl.float32
    hh = tl.arange(0, BH)
    rr = tl.arange(0, BR)
    mh, mr = hh < Hk, rr < R
    squares = tl.zeros([BH], dtype=CD)
    z = tl.zeros([BR], dtype=CD)
    g = tl.zeros([BH], dtype=CD)
    for start in range(0, I, BI):
        ii = start + tl.arange(0, BI)
        mi = ii < I
        xs = tl.load(x + n * x_n + hh[:, None] * I + ii[None, :], mask=mh[:, None] & mi[None, :], other=0.0).to(CD)
        squares += tl.sum(xs * xs, 1)
        xh = tl.load(x + n * x_n + hk * I + ii, mask=mi, other=0.0).to(CD)
        w = tl.load(weight + (hk * I + ii[:, None]) * M + rr[None, :], mask=mi[:, None] & mr[None, :], other=0.0).to(CD)
        z += tl.sum(xh[:, None] * w, 0)
        if GATE:
            wg = tl.load(weight + (hh[:, None] * I + ii[None, :]) * M + R + hk, mask=mh[:, None] & mi[None, :], other=0.0).to(CD)
            g += tl.sum(xs * wg, 1)
    if F64:  # float64 division and square root are correctly rounded already
        inv = 1.0 / tl.sqrt(squares + eps)
    else:
        inv = tl.div_rn(tl.full([BH], 1.0, CD), tl.sqrt_rn(squares + eps))  # [BH]
    inv_hk = tl.sum(tl.where(hh == hk, inv, 0.0), 0)
    gate = 0.0
    if GATE:
        logit = tl.sum(g * inv, 0) + tl.load(gate_bias + hk).to(CD)
        gate = 1.0 / (1.0 + tl.exp(-logit))
    return z * inv_hk, gate


@triton.jit
def generator_inputs_kernel(
    x, weight, gate_bias, u, gate, eps, x_n,
    Hk: tl.constexpr, I: tl.constexpr, R: tl.constexpr, M: tl.constexpr,
    BH: tl.constexpr, BI: tl.constexpr, BR: tl.constexpr, GATE: tl.constexpr, F64: tl.constexpr, PDL: tl.constexpr = False,
):
    """One program per (token n, key head hk): :func:`_token_inputs`, stored."""
    await_predecessor(PDL)
    n, hk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    rr = tl.arange(0, BR)
    z, g = _token_inputs(x, weight, gate_bias, eps, n, hk, x_n, Hk, I, R, M, BH, BI, BR, GATE, F64)
    tl.store(u + (n * Hk + hk) * R + rr, z.to(u.dtype.element_ty), mask=rr < R)
    if GATE:
        tl.store(gate + n * Hk + hk, g.to(gate.dtype.element_ty))


@kernel_op("srope::selective_rope_decode_inputs")
def _inputs_op(x: torch.Tensor, weight: torch.Tensor, gate_bias: torch.Tensor | None, pairs: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    count = x.shape[0]
    key_heads, chunk, width = weight.shape
    x = x.contiguous()
    weight = weight.contiguous()
    u = torch.empty(count, key_heads * pairs, dtype=weight.dtype, device=x.device)
    gate = torch.empty(count, key_heads if gate_bias is not None else 0, dtype=weight.dtype, device=x.device)
    block_r, block_i, warps = _inputs_tile(pairs, chunk)
    if count > 0:
        with on_device(x):
            generator_inputs_kernel[(count, key_heads)](
                x, weight, weight if gate_bias is None else gate_bias.contiguous(), u, gate, eps, x.stride(0),
                Hk=key_heads, I=chunk, R=pairs, M=width, BH=next_power_of_2(key_heads),
                BI=block_i, BR=block_r, GATE=gate_bias is not None, F64=weight.dtype == torch.float64,
                num_warps=warps, **pdl(x),
            )
    return u, gate


@_inputs_op.register_fake
def _inputs_op_fake(x, weight, gate_bias, pairs, eps):
    count, (key_heads, _, _) = x.shape[0], weight.shape
    return x.new_empty((count, key_heads * pairs), dtype=weight.dtype), x.new_empty((count, key_heads if gate_bias is not None else 0), dtype=weight.dtype)


def decode_generator_inputs(
    x: torch.Tensor, weight: torch.Tensor, pairs: int, gate_bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The generator's inputs for one token per sequence in one kernel: ``u [N, Hk·R]`` and
    the per-head gate ``[N, Hk]`` (None when ``gate_bias`` is None), as
    :meth:`srope.modules.SelectiveRoPE.generator_inputs` computes them for a full-rank ω
    map and a standard (or no) gate.

    Args:
        x: the block input ``[N, hidden]`` (or ``[N, 1, hidden]``).
        weight: ``[Hk, hidden/Hk, R (+ Hk)]``, the ω map's per-head weight followed by the
            per-head shares of the gate's first layer (``SelectiveRoPE._first_layers``), in
            the generator's dtype (float32 or float64), which the outputs take.
        gate_bias: ``[Hk]`` or None (no gate). eps: the ℓ2 normalisation's ε.
    """
    _check_token_inputs(x, weight, pairs, gate_bias)
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"the fused generator inputs need CUDA tensors, or TRITON_INTERPRET=1; got {x.device}")
    u, gate = _inputs_op(x.reshape(x.shape[0], -1), weight, gate_bias, pairs, float(eps))
    return u, (gate if gate_bias is not None else None)


def _check_token_inputs(x: torch.Tensor, weight: torch.Tensor, pairs: int, gate_bias: torch.Tensor | None) -> None:
    for name, value in (("x", x), ("weight", weight)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if weight.dim() != 3 or weight.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"weight must be float32/float64 [Hk, hidden/Hk, M], got {weight.dtype} {tuple(weight.shape)}")
    key_heads, chunk, width = weight.shape
    expected = pairs + (key_heads if gate_bias is not None else 0)
    if width != expected:
        raise ValueError(f"weight's last dimension must be R{' + Hk' if gate_bias is not None else ''} = {expected}, got {width}")
    if x.shape[-1] != key_heads * chunk or x.numel() != x.shape[0] * key_heads * chunk:
        raise _shape_error("x", f"[N, hidden] or [N, 1, hidden] with hidden = {key_heads * chunk}", x)
    if gate_bias is not None and tuple(gate_bias.shape) != (key_heads,):
        raise _shape_error("gate_bias", f"[Hk] = [{key_heads}]", gate_bias)
    if any(t is not None and t.device != x.device for t in (weight, gate_bias)):
        raise ValueError("x, weight and gate_bias must be on one device")


def _inputs_tile(pairs: int, chunk: int) -> tuple[int, int, int]:
    """``(BR, BI, num_warps)`` of :func:`_token_inputs`: one slice of the head chunk per loop
    step, the whole chunk up to 16k weights (one round trip to memory for a latency-bound
    launch of N·Hk programs)."""
    block_r = next_power_of_2(pairs)
    block_i = min(next_power_of_2(chunk), max(16, 16384 // block_r))
    if interpreting():
        block_i = min(block_i, 8)  # the loop over slices stays tested
    return block_r, block_i, 8 if block_i * block_r >= 8192 else 4


@kernel_op("srope::selective_rope_decode")
def _decode_op(
    q: torch.Tensor,
    k: torch.Tensor,
    u: torch.Tensor | None,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    phase: torch.Tensor,
    temperature: torch.Tensor,
    conv_bias: torch.Tensor | None,
    bias: torch.Tensor | None,
    gate: torch.Tensor | None,
    silu: bool,
    x: torch.Tensor | None = None,
    first: torch.Tensor | None = None,
    gate_bias: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    count, _, heads, head_dim = q.shape
    key_heads, pairs = phase.shape[1], phase.shape[2]
    width = conv_weight.shape[1]
    q, k = q.contiguous(), k.contiguous()
    conv_state, phase = conv_state.contiguous(), phase.contiguous()
    conv_weight, temperature = conv_weight.contiguous(), temperature.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    state_out, phase_out = torch.empty_like(conv_state), torch.empty_like(phase)
    rest = head_dim - 2 * pairs
    from_x = x is not None
    if from_x:  # u and the gate computed in the kernel; `first` stands for u's dtype
        x, u = x.contiguous(), first.contiguous()
        gate_kind = GATE_NONE if gate_bias is None else GATE_HEAD
        gate = u if gate_bias is None else gate_bias.contiguous()
        chunk, width_first = first.shape[1], first.shape[2]
        _, block_i, warps = _inputs_tile(pairs, chunk)
        inputs = dict(FROM_X=True, I=chunk, M=width_first, BH=next_power_of_2(key_heads), BI=block_i, X64=u.dtype == torch.float64)
    else:
        u = u.contiguous()
        gate_kind = GATE_NONE if gate is None else (GATE_CHANNEL if gate.numel() == count * key_heads * pairs else GATE_HEAD)
        gate = u if gate is None else gate.contiguous()
        warps, inputs = (1 if pairs * (heads + key_heads) <= 4096 else 4), {}
    if count > 0:
        with on_device(q):
            decode_step_kernel[(count, key_heads)](
                q, k, u, conv_state, conv_weight,
                u if conv_bias is None else conv_bias.contiguous(),
                u if bias is None else bias.contiguous(),
                gate, phase, temperature, q_out, k_out, state_out, phase_out,
                x if from_x else u, u, gate, float(eps),
                q.stride(0), q.stride(2), k.stride(0), k.stride(2), 0 if from_x else u.stride(0),
                conv_state.stride(0), conv_state.stride(1), 0 if from_x else gate.stride(0),
                pairs if temperature.dim() == 2 else 0, x.stride(0) if from_x else 0,
                Hk=key_heads, G=heads // key_heads, R=pairs, P=rest, W=width,
                BR=next_power_of_2(pairs), BP=next_power_of_2(max(rest, 1)),
                BW=next_power_of_2(width), SILU=silu, HAS_CONV_BIAS=conv_bias is not None,
                HAS_BIAS=bias is not None, GATE=gate_kind,
                F64=any(t.dtype == torch.float64 for t in (q, k, u, temperature)),
                PRECISE=not interpreting(), num_warps=warps, **inputs, **pdl(q),
            )
    return q_out, k_out, state_out, phase_out


@_decode_op.register_fake
def _decode_op_fake(q, k, u, conv_state, conv_weight, phase, temperature, conv_bias, bias, gate, silu, x=None, first=None, gate_bias=None, eps=0.0):
    return q.new_empty(q.shape), k.new_empty(k.shape), conv_state.new_empty(conv_state.shape), phase.new_empty(phase.shape)


def _shape_error(name: str, expected: str, value: torch.Tensor) -> ValueError:
    return ValueError(f"{name} must be {expected}, got {tuple(value.shape)}")


def selective_rope_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    u: torch.Tensor | None,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    phase: torch.Tensor,
    temperature: torch.Tensor,
    *,
    conv_bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    bias: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    x: torch.Tensor | None = None,
    first_layers: torch.Tensor | None = None,
    gate_bias: torch.Tensor | None = None,
    eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advance N sequences by one token: generator conv, activation, bias, gate, phase and
    the rotation of q and k, in one kernel. Its inputs u and gate are given, or (``u=None``
    and ``x`` given) computed in the same kernel from the token as
    :func:`decode_generator_inputs` computes them, with the same roundings.

    Args:
        q: ``[N, 1, H, D]``; k: ``[N, 1, Hk, D]`` with ``H % Hk == 0``.
        u: ``[N, 1, Hk·R]`` (or ``[N, Hk·R]``): the ω projection of the token, pre-conv;
            its dtype is the generator's (every intermediate rounds to it, as in torch).
            None with ``x``.
        conv_state: ``[N, Hk·R, W-1]``, the last ``W-1`` projected inputs.
        conv_weight: ``[Hk·R, W]`` taps, the current token last (``ShortConvolution.kernel()``).
        phase: ``[N, Hk, R]`` float64, Φ after the previous token.
        temperature: ``[R]`` or ``[Hk, R]``.
        conv_bias: ``[Hk·R]`` or None. activation: ``"silu"``/``"swish"`` or None.
        bias: ``[Hk, R]`` log-bias b (``exp(b)`` is added) or None.
        gate: per head ``[N, 1, Hk]`` / ``[N, Hk]`` or per channel ``[N, 1, Hk, R]`` /
            ``[N, Hk·R]`` (after the sigmoid), or None. None with ``x``.
        x, first_layers, gate_bias, eps: instead of u and gate, the block input ``[N, 1,
            hidden]`` and the arguments of :func:`decode_generator_inputs` (``first_layers``
            its ``weight``: full-rank ω map, per-head gate with ``gate_bias``, or none).

    Returns ``(q_rot, k_rot, new conv_state, new phase)``. Runs on CUDA, or on the CPU
    under ``TRITON_INTERPRET=1``. No autograd.
    """
    from_x = x is not None
    if from_x == (u is not None):
        raise ValueError("give either u (and gate) or x (with first_layers, gate_bias and eps), not both or neither")
    if from_x and (gate is not None or first_layers is None or eps is None):
        raise ValueError("with x, give first_layers and eps (and gate_bias for a gate) instead of gate")
    for name, value in (("q", q), ("k", k), ("first_layers" if from_x else "u", first_layers if from_x else u), ("conv_state", conv_state), ("conv_weight", conv_weight),
                        ("phase", phase), ("temperature", temperature)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    if q.dim() != 4 or q.shape[1] != 1:
        raise _shape_error("q", "[N, 1, H, D]", q)
    count, _, heads, head_dim = q.shape
    if k.dim() != 4 or k.shape[0] != count or k.shape[1] != 1 or k.shape[3] != head_dim or heads % max(k.shape[2], 1):
        raise _shape_error("k", f"[N, 1, Hk, D] = [{count}, 1, Hk, {head_dim}] with {heads} % Hk == 0", k)
    key_heads = k.shape[2]
    if phase.dim() != 3 or phase.shape[:2] != (count, key_heads) or phase.dtype != torch.float64:
        raise ValueError(f"phase must be float64 [N, Hk, R] = [{count}, {key_heads}, R], got {phase.dtype} {tuple(phase.shape)}")
    pairs = phase.shape[2]
    channels = key_heads * pairs
    if pairs < 1 or 2 * pairs > head_dim:
        raise ValueError(f"phase's last dimension R must satisfy 1 <= R and 2R <= head_dim={head_dim}, got R={pairs}")
    if from_x:
        _check_token_inputs(x, first_layers, pairs, gate_bias)
        if first_layers.shape[0] != key_heads or x.shape[0] != count:
            raise ValueError(f"x must be [N, 1, hidden] with N = {count} and first_layers [Hk, hidden/Hk, M] with Hk = {key_heads}, "
                             f"got {tuple(x.shape)} and {tuple(first_layers.shape)}")
    elif u.numel() != count * channels or u.shape[0] != count or u.shape[-1] != channels:
        raise _shape_error("u", f"[N, 1, Hk·R] = [{count}, 1, {channels}]", u)
    else:
        u = u.reshape(count, channels)
    if conv_weight.dim() != 2 or conv_weight.shape[0] != channels:
        raise _shape_error("conv_weight", f"[Hk·R, W] = [{channels}, W]", conv_weight)
    width = conv_weight.shape[1]
    if tuple(conv_state.shape) != (count, channels, width - 1):
        raise _shape_error("conv_state", f"[N, Hk·R, W-1] = [{count}, {channels}, {width - 1}]", conv_state)
    if tuple(temperature.shape) not in ((pairs,), (key_heads, pairs)):
        raise _shape_error("temperature", f"[R] = [{pairs}] or [Hk, R] = [{key_heads}, {pairs}]", temperature)
    if conv_bias is not None and tuple(conv_bias.shape) != (channels,):
        raise _shape_error("conv_bias", f"[Hk·R] = [{channels}]", conv_bias)
    if bias is not None and tuple(bias.shape) != (key_heads, pairs):
        raise _shape_error("bias", f"[Hk, R] = [{key_heads}, {pairs}]", bias)
    if gate is not None:
        if gate.shape[0] != count or gate.numel() not in (count * key_heads, count * channels):
            raise _shape_error("gate", f"[N, 1, Hk] or [N, 1, Hk, R] with N={count}, Hk={key_heads}, R={pairs}", gate)
        gate = gate.reshape(count, -1)
    tensors = (k, u, conv_state, conv_weight, phase, temperature, conv_bias, bias, gate, x, first_layers, gate_bias)
    if any(t is not None and t.device != q.device for t in tensors):
        raise ValueError("all inputs of the decode step must be on q's device")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"the fused decode step needs CUDA tensors, or TRITON_INTERPRET=1; got {q.device}")
    if from_x:
        return _decode_op(q, k, None, conv_state, conv_weight, phase, temperature, conv_bias, bias, None, activation is not None,
                          x.reshape(count, -1), first_layers, gate_bias, float(eps))
    return _decode_op(q, k, u, conv_state, conv_weight, phase, temperature, conv_bias, bias, gate, activation is not None)
