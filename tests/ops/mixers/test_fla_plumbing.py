"""The fla branches of the mixers, on the CPU, with stand-ins for fla's kernels.

The stand-ins have fla 0.6.0's signatures (keyword names, argument order, return values),
check the preconditions we rely on (float32 states, B == 1 and no empty sequences with
cu_seqlens, Tq == Tk), record which kernel was chosen, and compute with our own PyTorch
paths. So these tests check the plumbing around fla: kernel choice, argument passing, the
empty-sequence handling and the key_mask packing. fla's numbers are checked on the GPU.
"""

from __future__ import annotations

import pytest
import torch

from srope.ops.mixers import _common as common
from srope.ops.mixers import attention, delta_rule
from srope.ops.mixers import forgetting_attention, gated_delta_rule, gla, softmax_attention
from srope.ops.mixers.attention import attention_torch
from srope.ops.mixers.delta_rule import gated_delta_rule_torch
from srope.ops.mixers.gla import gla_torch
from tests.helpers import generator, rel_err
from tests.ops.mixers.common import attention_inputs, delta_inputs, gla_inputs, leaves


def _packed_ok(q, initial_state, cu_seqlens):
    if initial_state is not None:
        assert initial_state.dtype == torch.float32, "fla wants float32 states"
    if cu_seqlens is not None:
        assert q.shape[0] == 1 and bool((cu_seqlens[1:] > cu_seqlens[:-1]).all()), "B == 1, no empty sequences"
        if initial_state is not None:
            assert initial_state.shape[0] == len(cu_seqlens) - 1


class FakeFla:
    def __init__(self):
        self.calls = []

    def chunk_gla(self, q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
                  cu_seqlens=None, cu_seqlens_cpu=None):  # fmt: skip
        self.calls.append("chunk_gla")
        assert q.shape == k.shape == g.shape and not state_v_first
        _packed_ok(q, initial_state, cu_seqlens)
        o, s = gla_torch(q, k, v, g, scale, initial_state, cu_seqlens)
        return o, s if output_final_state else None

    def fused_recurrent_gla(self, q, k, v, gk=None, gv=None, scale=None, initial_state=None, output_final_state=False,
                            reverse=False, state_v_first=False, cu_seqlens=None, **kwargs):  # fmt: skip
        self.calls.append("fused_recurrent_gla")
        assert gv is None and not reverse
        _packed_ok(q, initial_state, cu_seqlens)
        o, s = gla_torch(q, k, v, gk, scale, initial_state, cu_seqlens)
        return o, s if output_final_state else None

    def chunk_gated_delta_rule(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                               state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                               cp_context=None, **kwargs):  # fmt: skip
        self.calls.append("chunk_gated_delta_rule")
        assert not (use_beta_sigmoid_in_kernel or allow_neg_eigval or state_v_first)
        _packed_ok(q, initial_state, cu_seqlens)
        o, s = gated_delta_rule_torch(q, k, v, beta, g, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel)
        return o, s if output_final_state else None

    def fused_recurrent_gated_delta_rule(self, q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                         initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                                         use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                         use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                         state_v_first=False, cu_seqlens=None, **kwargs):  # fmt: skip
        self.calls.append("fused_recurrent_gated_delta_rule")
        assert not torch.is_grad_enabled() or not any(x.requires_grad for x in (q, k, v, g, beta)), "forward-only kernel"
        _packed_ok(q, initial_state, cu_seqlens)
        o, s = gated_delta_rule_torch(q, k, v, beta, g, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel)
        return o, s if output_final_state else None

    def chunk_delta_rule(self, q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):  # fmt: skip
        self.calls.append("chunk_delta_rule")
        _packed_ok(q, initial_state, cu_seqlens)
        o, s = gated_delta_rule_torch(q, k, v, beta, None, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel)
        return o, s if output_final_state else None

    def fused_recurrent_delta_rule(self, q, k, v, beta=None, scale=None, initial_state=None, output_final_state=False,
                                   use_qk_l2norm_in_kernel=False, cu_seqlens=None):  # fmt: skip
        self.calls.append("fused_recurrent_delta_rule")
        _packed_ok(q, initial_state, cu_seqlens)
        o, s = gated_delta_rule_torch(q, k, v, beta, None, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel)
        return o, s if output_final_state else None

    def parallel_forgetting_attn(self, q, k, v, g, scale=None, window_size=None, cu_seqlens=None):
        self.calls.append("parallel_forgetting_attn")
        assert window_size is None and q.shape[1] == k.shape[1] and g.dtype == torch.float32
        _packed_ok(q, None, cu_seqlens)
        return attention_torch(q, k, v, g, scale, cu_seqlens)

    def parallel_attn(self, q, k, v, g=None, scale=None, window_size=None, cu_seqlens=None, chunk_indices=None, *,
                      sink_bias=None):  # fmt: skip
        self.calls.append("parallel_attn")
        assert g is None and sink_bias is None and window_size is None and q.shape[1] == k.shape[1]
        _packed_ok(q, None, cu_seqlens)
        return attention_torch(q, k, v, None, scale, cu_seqlens)


def _same_gradients(outputs, ref_outputs, inputs):
    """Gradients through the fla branch equal the torch path's; the last input is the
    initial state, whose gradient passes the float32 cast fla needs."""
    cot = [torch.randn(o.shape, generator=generator(99), dtype=o.dtype) for o in outputs]
    grads = torch.autograd.grad(outputs, inputs, cot)
    ref_grads = torch.autograd.grad(ref_outputs, inputs, cot)
    errors = [rel_err(a, b) for a, b in zip(grads, ref_grads)]
    assert max(errors[:-1]) < 1e-12 and errors[-1] < 1e-7, errors


@pytest.fixture
def fake(monkeypatch):
    fla = FakeFla()
    original = common.resolve_backend

    def resolve(backend, device, not_applicable=None):  # as on a CUDA machine with fla importable
        return original(backend, torch.device("cuda"), not_applicable) if backend != "torch" else "torch"

    monkeypatch.setattr(common, "resolve_backend", resolve)
    monkeypatch.setattr(common, "FLA_DTYPES", common.FLA_DTYPES + (torch.float64,))  # exact comparisons
    monkeypatch.setattr(common, "_load_fla", lambda: (fla, None))
    return fla


@pytest.mark.parametrize("length,kernel", [(40, "fused_recurrent_gla"), (70, "chunk_gla")])
@pytest.mark.parametrize("packed", [False, True])
def test_gla_calls(fake, length, kernel, packed):
    bounds = [0, 9, 9, 30, length] if packed else None
    q, k, v, g, h0 = gla_inputs(1 if packed else 2, length, 2, 4, 3, seed=1, states=4 if packed else None)
    q, k, v, g, h0 = leaves(q, k, v, g, h0.float().double())  # fla takes float32 states
    cu = None if bounds is None else torch.tensor(bounds)
    kwargs = dict(scale=0.4, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    out, final = gla(q, k, v, g, **kwargs)
    assert fake.calls == [kernel]
    ref, ref_final = gla(q, k, v, g, backend="torch", **kwargs)
    assert rel_err(out, ref) < 1e-12 and rel_err(final, ref_final) < 1e-7
    if packed:
        assert torch.equal(final[1], h0[1].float())  # the empty sequence, dropped for fla, keeps its state
    _same_gradients([out, final], [ref, ref_final], [q, k, v, g, h0])


@pytest.mark.parametrize(
    "gated,grad,length,kernel",
    [
        (True, True, 40, "chunk_gated_delta_rule"),  # the fused recurrent gated kernel has no backward
        (True, False, 40, "fused_recurrent_gated_delta_rule"),
        (True, False, 70, "chunk_gated_delta_rule"),
        (False, True, 40, "fused_recurrent_delta_rule"),
        (False, True, 70, "chunk_delta_rule"),
    ],
)
def test_gated_delta_rule_calls(fake, gated, grad, length, kernel):
    q, k, v, beta, g, h0 = delta_inputs(1, length, 2, 4, 3, seed=2, states=3, max_beta=2.0, unit_keys=False)
    q, k, v, beta, g, h0 = leaves(q, k, v, beta, g, h0.float().double())
    g = g if gated else None
    cu = torch.tensor([0, 0, 11, length])
    kwargs = dict(scale=0.4, qk_l2norm=True, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    with torch.set_grad_enabled(grad):
        out, final = gated_delta_rule(q, k, v, beta, g, **kwargs)
    assert fake.calls == [kernel]
    ref, ref_final = gated_delta_rule(q, k, v, beta, g, backend="torch", **kwargs)
    assert rel_err(out, ref) < 1e-12 and rel_err(final, ref_final) < 1e-7
    assert torch.equal(final[0], h0[0].float())
    if grad:
        _same_gradients([out, final], [ref, ref_final], [x for x in (q, k, v, beta, g, h0) if x is not None])


def test_gated_delta_rule_training_where_fla_is_broken(fake, monkeypatch):
    original = delta_rule.issue_640_problem  # make the guard see a CUDA device
    monkeypatch.setattr(delta_rule, "issue_640_problem", lambda device, **kw: original(torch.device("cuda"), **kw))
    monkeypatch.setattr(common, "fla_gated_backward_is_broken", lambda device=None: True)
    monkeypatch.setattr(common, "_warned", set())
    q, k, v, beta, g, h0 = leaves(*delta_inputs(1, 70, 2, 4, 3, seed=3))
    with pytest.warns(RuntimeWarning, match="#640"):
        out = gated_delta_rule(q, k, v, beta, g, initial_state=h0)[0]
    assert fake.calls == []  # training took the torch path
    assert rel_err(out, gated_delta_rule(q, k, v, beta, g, initial_state=h0, backend="torch")[0]) == 0
    with torch.no_grad():
        gated_delta_rule(q, k, v, beta, g, initial_state=h0)
    assert fake.calls == ["chunk_gated_delta_rule"]  # forward-only still uses fla
    gated_delta_rule(q, k, v, beta, None, initial_state=h0)
    assert fake.calls[-1] == "chunk_delta_rule"  # plain DeltaNet is not affected
    with pytest.raises(RuntimeError, match="#640"):
        gated_delta_rule(q, k, v, beta, g, backend="fla")


@pytest.mark.parametrize("with_cu", [False, True])
def test_forgetting_attention_packs_the_key_mask_for_fla(fake, with_cu):
    batch = 1 if with_cu else 3
    q, k, v, f = attention_inputs(batch, 24, 24, 4, 2, 8, 6, seed=4)
    q, k, v, f = leaves(q, k, v, f.float().double())  # fla takes float32 gates
    mask = torch.rand(batch, 24, generator=generator(5)) > 0.3
    mask[0, :6] = False  # left padding of the first row (and the first packed sequence)
    cu = torch.tensor([0, 6, 6, 15, 24]) if with_cu else None
    out = forgetting_attention(q, k, v, f, key_mask=mask, cu_seqlens=cu)
    assert fake.calls == ["parallel_forgetting_attn"]
    ref = forgetting_attention(q, k, v, f, key_mask=mask, cu_seqlens=cu, backend="torch")
    assert rel_err(out, ref) < 1e-12
    cot = torch.randn(out.shape, generator=generator(6), dtype=out.dtype)
    grads = torch.autograd.grad(out, [q, k, v, f], cot)
    ref_grads = torch.autograd.grad(ref, [q, k, v, f], cot)
    errors = [rel_err(a, b) for a, b in zip(grads, ref_grads)]
    assert max(errors[:3]) < 1e-12 and errors[3] < 1e-7, errors  # the gate's gradient passes a float32 cast


def test_attention_kernel_choice(fake):
    q, k, v, f = attention_inputs(1, 20, 20, 4, 2, 8, 6, seed=7)
    cu = torch.tensor([0, 7, 7, 20])
    fla_out = softmax_attention(q, k, v, cu_seqlens=cu, backend="fla")
    assert rel_err(fla_out, softmax_attention(q, k, v, cu_seqlens=cu, backend="torch")) < 1e-12
    assert fake.calls == ["parallel_attn"]
    forgetting_attention(q[:, -1:], k, v, f)  # decoding (Tq < Tk): fla does not apply, auto takes torch
    assert fake.calls == ["parallel_attn"]
    with pytest.raises(ValueError, match="Tq == Tk"):
        forgetting_attention(q[:, -1:], k, v, f, backend="fla")


def test_float64_is_not_an_fla_dtype():
    assert "float16/bfloat16/float32" in common.fla_dtype_problem(torch.zeros(1, dtype=torch.float64))
    assert common.fla_dtype_problem(torch.zeros(1, dtype=torch.bfloat16), None) is None


@pytest.mark.parametrize("first", ["choice", "kernels"])
def test_backend_choice_traces_without_graph_breaks(monkeypatch, first):
    """torch.compile of a call that picks fla: fla's import and the choice run on the host
    and cost no graph break, whichever comes first (on the H200 they broke a 2-layer
    GLA-370M model's graph 12 times)."""
    kernels = type("Kernels", (), {"chunk_gla": staticmethod(lambda x: x * 2)})()

    def import_fla():  # what fla's import did under compile: a break, unless it runs on the host
        torch._dynamo.graph_break()
        return kernels, None

    monkeypatch.setattr(common, "_FLA", None)  # not imported yet
    monkeypatch.setattr(common, "_import_fla", import_fla)
    cuda = torch.device("cuda", 0)

    def step(x):
        x = x * 3  # (a break before any tensor work would not count)
        if first == "kernels":  # as the short conv: fla's kernels asked for before any backend choice
            assert common.fla_ops() is kernels
        if common.resolve_backend("auto", cuda) == "fla" and not common.fla_gated_backward_is_broken(cuda):
            return common.fla_ops().chunk_gla(x)
        return x

    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(torch.ones(3))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert torch.equal(torch.compile(step, backend="eager", fullgraph=True)(torch.ones(3)), torch.full((3,), 6.0))


def test_warnings_trace_without_graph_breaks(monkeypatch):
    """A mixer's one-time warning (fla #640's) runs on the host under torch.compile: no graph
    break, and it is still issued, once. (torch 2.11's dynamo broke the graph at
    ``warnings.warn``, on the H200; the stand-in below breaks as it did.)"""
    issued = []

    def warn(message, category, stacklevel):
        torch._dynamo.graph_break()
        issued.append(message)

    monkeypatch.setattr(common, "_warned", set())
    monkeypatch.setattr(common.warnings, "warn", warn)

    def step(x):
        x = x * 3  # (a break before any tensor work would not count)
        common.warn_once("test-key", "srope test warning")
        return x * 2

    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(torch.ones(3))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert torch.equal(torch.compile(step, backend="eager", fullgraph=True)(torch.ones(3)), torch.full((3,), 6.0))
    assert issued == ["srope test warning"]


def test_attention_rows_too_wide_for_fla_take_torch(fake):
    """float32 at head size 128 (512 bytes a row) overflows fla's shared memory on Hopper:
    auto takes the torch path, backend="fla" says why; 16-bit at 128 fits."""
    q, k, v, f = (t.float() for t in attention_inputs(1, 20, 20, 2, 2, 128, 128, seed=8))
    cu = torch.tensor([0, 7, 20])
    softmax_attention(q, k, v, cu_seqlens=cu)
    forgetting_attention(q, k, v, f, cu_seqlens=cu)
    assert fake.calls == []
    with pytest.raises(ValueError, match="shared memory at 512 bytes"):
        forgetting_attention(q, k, v, f, cu_seqlens=cu, backend="fla")
    assert attention._fla_problem(q.bfloat16(), k.bfloat16(), v.bfloat16()) is None
