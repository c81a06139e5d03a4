"""Inputs and comparisons shared by the mixer tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.helpers import generator, randn, rel_err


def leaves(*tensors, dtype=None, device=None):
    """Fresh leaf copies (requires_grad) of the floating tensors; None stays None."""
    out = []
    for t in tensors:
        if t is None or not t.is_floating_point():
            out.append(t)
            continue
        t = t.detach().to(dtype=dtype or t.dtype, device=device or t.device)
        out.append(t.clone().requires_grad_())
    return out


def backward_grads(outputs, inputs, cotangents):
    """Gradients of ``Σ <output, cotangent>`` with respect to every non-None input."""
    pairs = [(o, c) for o, c in zip(outputs, cotangents) if o is not None]
    wanted = [x for x in inputs if x is not None and x.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], wanted, [c.to(o.dtype) for o, c in pairs])
    return list(grads)


def assert_close_all(names, actual, expected, tol):
    for name, a, b in zip(names, actual, expected):
        err = rel_err(a, b)
        assert err < tol, f"{name}: relative error {err:.3e} >= {tol:.0e}"


def cotangents_like(seed, *tensors):
    g = generator(seed)
    return [None if t is None else randn(*t.shape, seed_gen=g) for t in tensors]


def l2norm(x):
    """fla's l2 normalisation, x / sqrt(Σx² + 1e-6), written out independently."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gla_inputs(batch, length, heads, key_dim, value_dim, *, seed, states=None, decay_scale=1.0):
    """q, k, v, log_decay (<= 0) and an initial state [N, H, K, V] (N = states or B), float64."""
    g = generator(seed)
    q = randn(batch, length, heads, key_dim, seed_gen=g)
    k = randn(batch, length, heads, key_dim, seed_gen=g)
    v = randn(batch, length, heads, value_dim, seed_gen=g)
    log_decay = decay_scale * F.logsigmoid(randn(batch, length, heads, key_dim, seed_gen=g) + 1.0)
    h0 = randn(states or batch, heads, key_dim, value_dim, seed_gen=g)
    return q, k, v, log_decay, h0


def delta_inputs(batch, length, heads, key_dim, value_dim, *, seed, states=None, max_beta=1.0, unit_keys=True):
    """q, k (unit norm unless told), v, beta in (0, max_beta), log_decay <= 0, h0; float64."""
    g = generator(seed)
    q = randn(batch, length, heads, key_dim, seed_gen=g)
    k = randn(batch, length, heads, key_dim, seed_gen=g)
    if unit_keys:
        k = F.normalize(k, dim=-1)
    v = randn(batch, length, heads, value_dim, seed_gen=g)
    beta = max_beta * torch.sigmoid(randn(batch, length, heads, seed_gen=g))
    log_decay = F.logsigmoid(randn(batch, length, heads, seed_gen=g) + 2.0)
    h0 = randn(states or batch, heads, key_dim, value_dim, seed_gen=g)
    return q, k, v, beta, log_decay, h0


def attention_inputs(batch, q_len, key_len, heads, kv_heads, head_dim, value_dim, *, seed):
    """q, k, v and log_forget [B, Tk, H] (<= 0), float64."""
    g = generator(seed)
    q = randn(batch, q_len, heads, head_dim, seed_gen=g)
    k = randn(batch, key_len, kv_heads, head_dim, seed_gen=g)
    v = randn(batch, key_len, kv_heads, value_dim, seed_gen=g)
    log_forget = F.logsigmoid(randn(batch, key_len, heads, seed_gen=g) + 1.5)
    return q, k, v, log_forget


def split_packed(cu_seqlens):
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))
