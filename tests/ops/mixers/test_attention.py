"""forgetting_attention / softmax_attention against a query-by-query loop (float64)."""

from __future__ import annotations

import pytest
import torch

from srope.ops.mixers import forgetting_attention, softmax_attention
from srope.ops.mixers import naive as mixers_naive
from srope.ops.mixers.attention import attention_torch, sdpa_attention
from tests.helpers import generator, rel_err
from tests.ops.mixers.common import assert_close_all, attention_inputs, backward_grads, cotangents_like, leaves, split_packed

# (B, Tq, Tk, H, Hk, D, Dv)
SHAPES = [
    (1, 1, 1, 1, 1, 4, 3),  # T = 1
    (2, 7, 7, 2, 2, 8, 5),  # odd T
    (2, 13, 13, 4, 2, 8, 6),  # GQA
    (2, 5, 19, 4, 1, 6, 4),  # Tq < Tk (KV cache), multi-query
    (1, 1, 9, 2, 2, 4, 4),  # decode one token
]


def torch_path(gated):
    """The public function with the torch backend, as f(q, k, v, log_forget, **kw)."""
    if gated:
        return lambda q, k, v, f, **kw: forgetting_attention(q, k, v, f, backend="torch", **kw)
    return lambda q, k, v, f, **kw: softmax_attention(q, k, v, backend="torch", **kw)


def sdpa_path(q, k, v, f, scale=None, cu_seqlens=None, key_mask=None):
    return sdpa_attention(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale, cu_seqlens, key_mask)


PATHS = {"forgetting": torch_path(True), "softmax": torch_path(False), "softmax-sdpa": sdpa_path}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("path", list(PATHS))
def test_matches_query_loop_forward_and_backward(shape, path):
    gated = path == "forgetting"
    q, k, v, log_forget = leaves(*attention_inputs(*shape, seed=1))
    out = PATHS[path](q, k, v, log_forget)
    ref = mixers_naive.causal_attention_loop(q, k, v, log_forget if gated else None, shape[5] ** -0.5)
    assert out.dtype == torch.float64 and rel_err(out, ref) < 1e-10
    inputs = [q, k, v, log_forget if gated else None]
    (cot,) = cotangents_like(2, out)
    assert_close_all("q k v log_forget".split(), backward_grads([out], inputs, [cot]), backward_grads([ref], inputs, [cot]), 1e-10)


def test_query_blocks_and_scale():
    q, k, v, log_forget = attention_inputs(2, 9, 12, 4, 2, 8, 5, seed=3)
    whole = attention_torch(q, k, v, log_forget, 0.2)
    blocked = attention_torch(q, k, v, log_forget, 0.2, block_elements=1)  # one query per block
    assert rel_err(blocked, whole) < 1e-14
    assert rel_err(whole, mixers_naive.causal_attention_loop(q, k, v, log_forget, 0.2)) < 1e-12


def test_gradcheck():
    q, k, v, log_forget = leaves(*attention_inputs(1, 3, 4, 2, 1, 3, 2, seed=4))
    assert torch.autograd.gradcheck(lambda *x: forgetting_attention(*x), (q, k, v, log_forget), fast_mode=True)
    mask = torch.tensor([[True, False, True, True]])
    assert torch.autograd.gradcheck(lambda *x: forgetting_attention(*x, key_mask=mask), (q, k, v, log_forget), fast_mode=True)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("q_len", [1, 3, 8])
def test_decode_rows_equal_full_causal_call(path, q_len):
    q, k, v, log_forget = attention_inputs(2, 17, 17, 4, 2, 8, 6, seed=5)
    full = PATHS[path](q, k, v, log_forget)
    assert rel_err(PATHS[path](q[:, -q_len:], k, v, log_forget), full[:, -q_len:]) < 1e-12


@pytest.mark.parametrize("path", list(PATHS))
def test_packed_equals_sequences_one_by_one(path):
    cu = torch.tensor([0, 4, 4, 11, 12, 20], dtype=torch.int32)
    q, k, v, log_forget = leaves(*attention_inputs(1, 20, 20, 4, 2, 8, 6, seed=6))
    out = PATHS[path](q, k, v, log_forget, cu_seqlens=cu)
    (cot,) = cotangents_like(7, out)
    inputs = [q, k, v, log_forget if path == "forgetting" else None]
    grads = backward_grads([out], inputs, [cot])
    expected = [torch.zeros_like(x) for x in inputs if x is not None]
    for s, e in split_packed(cu):
        if s == e:
            continue
        part = leaves(*[None if x is None else x[:, s:e] for x in inputs])
        one = PATHS[path](*part)
        assert rel_err(out[:, s:e], one) < 1e-12
        for full, g in zip(expected, backward_grads([one], part, [cot[:, s:e]])):
            full[:, s:e] = g
    assert_close_all("q k v log_forget".split(), grads, expected, 1e-12)


def _masks():
    left = torch.tensor([[0] * 4 + [1] * 12, [1] * 16, [0] * 15 + [1]], dtype=torch.bool)  # left padding
    holes = torch.rand(3, 16, generator=generator(8)) > 0.35
    holes[:, -1] = True
    right = left.flip(1)  # right padding: the last query positions are absent
    return {"left padding": left, "holes (0/1 ints)": holes.long(), "right padding": right}


@pytest.mark.parametrize("mask_name", list(_masks()))
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("q_len", [16, 5])
def test_key_mask_equals_running_without_those_tokens(mask_name, path, q_len):
    key_mask = _masks()[mask_name]
    q, k, v, log_forget = leaves(*attention_inputs(3, q_len, 16, 4, 2, 8, 6, seed=9))
    out = PATHS[path](q, k, v, log_forget, key_mask=key_mask)
    (cot,) = cotangents_like(10, out)
    gated = path == "forgetting"
    inputs = [q, k, v, log_forget if gated else None]
    grads = backward_grads([out], inputs, [cot])
    expected = [torch.zeros_like(x) for x in inputs if x is not None]  # absent tokens get no gradient
    for b in range(3):
        present = key_mask[b].bool()
        q_present = present[16 - q_len :]
        assert torch.all(out[b][~q_present] == 0)  # queries at absent positions give 0
        if not q_present.any():
            continue
        # This row on its present tokens only; its queries are the present ones among the last q_len.
        alone = leaves(q[b : b + 1, q_present], *[x[b : b + 1, present] for x in (k, v, log_forget)])
        alone[3] = alone[3] if gated else None
        one = PATHS[path](*alone)
        assert rel_err(out[b : b + 1, q_present], one) < 1e-12
        one_grads = backward_grads([one], alone, [cot[b : b + 1, q_present]])
        expected[0][b : b + 1, q_present] = one_grads[0]
        for full, g in zip(expected[1:], one_grads[1:]):
            full[b : b + 1, present] = g
    assert_close_all("q k v log_forget".split(), grads, expected, 1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("path", list(PATHS))
def test_low_precision_matches_float64(dtype, tol, path):
    q, k, v, log_forget = attention_inputs(2, 33, 33, 4, 2, 8, 6, seed=11)
    low = leaves(q.to(dtype), k.to(dtype), v.to(dtype), log_forget.float())
    high = leaves(*low, dtype=torch.float64)
    out, ref = PATHS[path](*low), PATHS[path](*high)
    assert out.dtype == dtype and rel_err(out, ref) < tol
    (cot,) = cotangents_like(12, out)
    inputs_low = low if path == "forgetting" else low[:3] + [None]
    inputs_high = high if path == "forgetting" else high[:3] + [None]
    grads = backward_grads([out], inputs_low, [cot])
    assert_close_all("q k v log_forget".split(), grads, backward_grads([ref], inputs_high, [cot]), tol)


def test_long_forget_sums_keep_float32_precision():
    """Cumulative log-forget gates reach about -9000 over 3000 tokens. The float32 path forms
    the gate sums from a float64 running sum and stays within 1e-6 of float64; a float32
    running sum (computed here too) loses more than 1e-5."""
    length = 3000
    q, k, v, _ = attention_inputs(1, length, length, 1, 1, 4, 4, seed=13)
    log_forget = (-3.0 + 2.9 * torch.rand(1, length, 1, generator=generator(14), dtype=torch.float64)).float()
    ref = forgetting_attention(q, k, v, log_forget.double())
    q, k, v = q.float(), k.float(), v.float()
    assert rel_err(forgetting_attention(q, k, v, log_forget), ref) < 1e-6
    running = log_forget[0, :, 0].cumsum(0)  # float32
    logits = 0.5 * (q[0, :, 0] @ k[0, :, 0].T) + (running[:, None] - running[None, :])
    logits = logits.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), float("-inf"))
    assert rel_err((logits.softmax(-1) @ v[0, :, 0])[None, :, None], ref) > 1e-5
