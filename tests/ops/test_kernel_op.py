"""KernelOp: eager calls go straight to the launch function (through an autograd.Function built
from the op's own formula), traced calls see the torch.library op; both give the same numbers."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from srope.ops._triton import cdiv, kernel_op, next_power_of_2
from tests.helpers import generator, randn

CALLS = {"forward": 0, "backward": 0}


@kernel_op("srope_test::scaled_sum")
def _scaled_sum(a: torch.Tensor, b: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    CALLS["forward"] += 1
    return (a + b) * scale, (a * b).sum().reshape(1)


@_scaled_sum.register_fake
def _(a, b, scale):
    return torch.empty_like(a), a.new_empty(1)


@kernel_op("srope_test::scaled_sum_bwd")
def _scaled_sum_bwd(d: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    CALLS["backward"] += 1
    return d * scale, d * scale


@_scaled_sum_bwd.register_fake
def _(d, a, b, scale):
    return torch.empty_like(d), torch.empty_like(d)


def _setup(ctx, inputs, output):
    a, b, ctx.scale = inputs
    ctx.save_for_backward(a, b)
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _backward(ctx, d, _dsum):
    a, b = ctx.saved_tensors
    da, db = _scaled_sum_bwd(d, a, b, ctx.scale)
    return da if ctx.needs_input_grad[0] else None, db if ctx.needs_input_grad[1] else None, None


_scaled_sum.register_autograd(_backward, setup_context=_setup)


def _inputs():
    g = generator(3)
    return randn(5, 4, seed_gen=g).requires_grad_(), randn(5, 4, seed_gen=g).requires_grad_()


def _run(call):
    a, b = _inputs()
    out, total = call(a, b, 0.5)
    out.square().sum().backward()
    return out.detach(), total, a.grad, b.grad, out.grad_fn.name()


def test_eager_calls_skip_the_dispatcher_and_equal_the_op():
    eager = _run(_scaled_sum)
    op = _run(_scaled_sum.op)
    for x, y in zip(eager[:4], op[:4]):
        assert torch.equal(x, y)
    assert eager[4] == "scaled_sumBackward"  # the Function named after the launch function
    assert op[4] != eager[4]  # the custom op's generated node


def test_the_eager_backward_cannot_be_differentiated_again():
    a, b = _inputs()
    out, _ = _scaled_sum(a, b, 2.0)
    (da,) = torch.autograd.grad(out.square().sum(), a, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        da.sum().backward()


def test_compile_sees_the_ops():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(lambda a, b: _scaled_sum(a, b, 0.5)[0].square().sum(), backend=backend, fullgraph=True)
    a, b = _inputs()
    compiled(a, b).backward()
    assert "srope_test.scaled_sum" in graphs[0].code
    reference = _run(_scaled_sum)
    assert torch.equal(a.grad, reference[2]) and torch.equal(b.grad, reference[3])


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_tracing_sees_the_ops_forward_and_backward():
    """make_fx (a dispatch mode, no torch.compile) and torch.jit.trace record the ops, not
    their launches; opcheck's checks of the op pass."""
    a, b = (t.detach() for t in _inputs())
    graph = make_fx(lambda a, b: _scaled_sum(a, b, 0.5)[0])(a, b)
    assert "srope_test.scaled_sum" in graph.code
    torch.library.opcheck(_scaled_sum.op, (*_inputs(), 0.5))
    traced = torch.jit.trace(lambda a, b: _scaled_sum(a, b, 0.5)[0], (a, b))
    assert "srope_test::scaled_sum" in str(traced.graph)


def test_no_grad_keywords_and_an_op_without_autograd():
    a, b = _inputs()
    with torch.no_grad():
        out, _ = _scaled_sum(a, b, 0.5)
    assert out.grad_fn is None and torch.equal(out, (a + b) * 0.5)
    by_name, _ = _scaled_sum(a, b=b, scale=0.5)  # bound to the op's signature, as the op binds it
    assert by_name.grad_fn.name() == "scaled_sumBackward" and torch.equal(by_name, out)
    with torch.no_grad():
        assert torch.equal(_scaled_sum_bwd(a, a, b, scale=2.0)[0], a * 2.0)
    # without autograd of its own, a call that could record a graph takes the op, whose outputs
    # refuse a backward instead of silently giving no gradient
    da, _ = _scaled_sum_bwd(a, a, b, 2.0)
    with pytest.raises(RuntimeError, match="autograd"):
        da.sum().backward()


def test_fx_symbolic_trace_records_the_op():
    graph = torch.fx.symbolic_trace(lambda a, b: _scaled_sum(a, b, 0.5)[0])
    assert "srope_test.scaled_sum" in graph.code


def test_aot_autograd_traces_the_backward_through_the_ops():
    from functorch.compile import aot_function, make_boxed_func

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm.code
            return make_boxed_func(gm)

        return compiler

    compiled = aot_function(lambda a, b: _scaled_sum(a, b, 0.5)[0].square().sum(), fw_compiler=keep("forward"),
                            bw_compiler=keep("backward"))
    compiled(*_inputs()).backward()
    assert "srope_test.scaled_sum." in graphs["forward"] and "srope_test.scaled_sum_bwd" in graphs["backward"]


def test_host_integer_helpers_equal_tritons():
    import triton

    for n in [*range(0, 70), 127, 128, 129, 1000, 4096, 4097, 2**31 - 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 2, 3, 16, 64, 1000):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)


def _kernel_cases(device):
    """(KernelOp, its arguments) for every srope op with autograd, gradients asked of each
    floating-point input: the rotations (dense and packed), the generator's weights, gate, conv gate."""
    from srope.ops.generator import gate, weights
    from srope.ops.rotary import chunk

    g = generator(31)

    def r(*shape, scale=1.0):
        return randn(*shape, seed_gen=g, scale=scale, dtype=torch.float32).to(device).requires_grad_()

    cu = torch.tensor([0, 4, 4, 9], dtype=torch.int32, device=device)
    rotation = (r(1, 9, 4, 8), r(1, 9, 2, 8), r(1, 9, 2, 3), r(2, 3))
    return {
        "selective_rope": (chunk.selective_rope_fwd, (*rotation, r(1, 2, 3), None, None, None, 4)),
        "selective_rope_packed": (chunk.selective_rope_fwd, (*rotation, r(3, 2, 3), cu, *chunk.chunk_tables(cu, 9, 4), 4)),
        "rope": (chunk.rope_fwd, (*rotation[:2], torch.arange(9, device=device)[None], r(3), 4)),
        "head_weights": (weights._weights_op, (r(2, 11, 5), r(2), r(3, 22))),
        "head_gate": (gate._apply_op, (r(10, 6, scale=2.0), r(10, 2, 2, scale=2.0), r(2), r(2, 3), True)),
        "conv_head_gate": (gate._conv_gate_op, (r(2, 5, 6, scale=2.0), r(6, 4), r(6), r(10, 2, 2, scale=2.0), r(2), r(2, 3), True)),
    }


@pytest.mark.kernels
@pytest.mark.parametrize("case", ["selective_rope", "selective_rope_packed", "rope", "head_weights", "head_gate", "conv_head_gate"])
def test_srope_ops_eager_equal_their_torch_library_route(case, device):
    """Each op's eager route (direct launches) against its custom op: outputs and every
    gradient bitwise (the same kernels, in the same order)."""
    kop, args = _kernel_cases(device)[case]
    results, routes = [], []
    for call in (kop, kop.op):
        leaves = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]
        out = call(*leaves)
        out = out if isinstance(out, tuple) else (out,)
        weights = [torch.linspace(-1, 1, o.numel(), device=device).reshape(o.shape) for o in out if o.requires_grad]
        sum(((o * w).sum() for o, w in zip((o for o in out if o.requires_grad), weights))).backward()
        results.append(([o.detach() for o in out], [a.grad for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]))
        routes.append(out[0].grad_fn.name())
    assert routes[0] != routes[1] and routes[1].startswith("GeneratedBackwardFor_srope_")
    (eager_out, eager_grads), (op_out, op_grads) = results
    assert len(eager_grads) == len(op_grads) > 0
    for x, y in zip(eager_out + eager_grads, op_out + op_grads):
        assert x is not None and torch.equal(x, y)
