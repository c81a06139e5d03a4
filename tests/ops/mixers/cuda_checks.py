"""CUDA paths of the mixers against the CPU float64 reference: one table of cases, used by
``tests/ops/mixers/test_cuda.py``. Importable without a GPU.

Every case builds float64 inputs on the CPU, rounds them to the case's dtype, runs the
mixer on the device (forward, and backward with random cotangents for every input incl.
the initial state), and compares outputs, final states and gradients with the same
function run by the torch backend in float64 on the CPU on the rounded inputs. Errors are
relative RMS (``tests.helpers.rel_err``), with these tolerances: our PyTorch paths
in float32 1e-5, library kernels in float32 (fla, which uses TF32, and SDPA) 5e-3, bfloat16
1e-2.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
import torch.nn.functional as F

from srope.ops.mixers import (
    fla_available,
    fla_gated_backward_is_broken,
    forgetting_attention,
    gated_delta_rule,
    gla,
    softmax_attention,
)
from srope.ops.mixers import _common as common
from srope.ops.mixers.attention import sdpa_attention
from tests.helpers import generator, randn, rel_err

MIXERS = ("gla", "gdn", "deltanet", "fox", "attention")
RECURRENT = ("gla", "gdn", "deltanet")

# Head layouts of the 370M layers (fla's autotune keys include H, K and V: matching them
# reuses the carried autotune cache). T and B are chosen per run.
HEADS = {
    "gla": dict(heads=4, key_dim=128, value_dim=256),
    "gdn": dict(heads=8, key_dim=128, value_dim=128),
    "deltanet": dict(heads=8, key_dim=128, value_dim=128),
    "fox": dict(heads=16, kv_heads=4, key_dim=64, value_dim=64),  # GQA
    "attention": dict(heads=16, kv_heads=4, key_dim=64, value_dim=64),
}


def tolerance(dtype: torch.dtype, impl: str) -> float:
    if dtype == torch.bfloat16:
        return 1e-2
    return 1e-5 if impl == "torch" else 5e-3


@dataclasses.dataclass(frozen=True)
class Case:
    mixer: str  # gla | gdn | deltanet | fox | attention
    backend: str  # what we ask for: fla | torch | auto (| sdpa: softmax attention's SDPA path directly)
    impl: str  # what must run: fla | torch | sdpa (sets the tolerance)
    dtype: torch.dtype
    mode: str  # dense | packed | masked (left padding) | decode
    grad: bool = True

    @property
    def name(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"{self.mixer}-{self.backend}->{self.impl}-{dtype}-{self.mode}{'' if self.grad else '-fwd'}"


def cases() -> list[Case]:
    """All checks. fla cases are listed whether or not fla is importable (``run_case``
    reports them as skipped then). On GPUs where fla's gated backward is broken (fla #640)
    the fla GDN cases are forward-only, and the ``auto`` GDN case must take the torch path."""
    broken = torch.cuda.is_available() and fla_gated_backward_is_broken()
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for mixer in MIXERS:
            modes = ("dense", "packed", "decode") if mixer in RECURRENT else ("dense", "packed", "masked")
            for mode in modes:
                if mixer == "attention" and mode == "dense":
                    continue  # plain causal attention runs on SDPA (auto), listed below
                if mixer == "deltanet" and dtype == torch.float32:
                    continue  # fla's chunk_delta_rule refuses float32: "auto" takes torch (below)
                grad = mode != "decode" and not (mixer == "gdn" and broken)
                out.append(Case(mixer, "fla", "fla", dtype, mode, grad))
            for mode in ("dense", "packed", "masked" if mixer in ("fox", "attention") else "decode"):
                out.append(Case(mixer, "torch", "torch", dtype, mode, mode != "decode"))
        out.append(Case("gdn", "auto", "torch" if broken else "fla", dtype, "dense"))
        if dtype == torch.float32:
            out.append(Case("deltanet", "auto", "torch", dtype, "dense"))
        out.append(Case("fox", "auto", "torch", dtype, "decode", grad=False))
        out.append(Case("attention", "auto", "sdpa", dtype, "dense"))
        out.append(Case("attention", "auto", "sdpa", dtype, "decode", grad=False))
        out.append(Case("attention", "sdpa", "sdpa", dtype, "packed"))  # what "auto" uses without fla
        out.append(Case("attention", "sdpa", "sdpa", dtype, "masked"))
    return out


# ----------------------------------------------------------------------------------------
# Inputs and calls
# ----------------------------------------------------------------------------------------


def packed_bounds(length: int) -> list[int]:
    """Packed sequences of ``length`` tokens in all: a long one, an empty one, one token, the rest."""
    a, b = length // 3, length // 3 + 1
    return [0, a, a, b, length - length // 5, length]


def make_inputs(mixer: str, batch: int, length: int, count: int, seed: int) -> dict[str, torch.Tensor]:
    """float64 CPU inputs with gates like the layers': GLA logsigmoid/16, GDN logsigmoid
    decays and sigmoid betas (DeltaNet: beta in (0, 2)), FoX logsigmoid forget gates."""
    g = generator(seed)
    dims = HEADS[mixer]
    heads, key_dim, value_dim = dims["heads"], dims["key_dim"], dims["value_dim"]
    kv_heads = dims.get("kv_heads", heads)
    x = {
        "q": randn(batch, length, heads, key_dim, seed_gen=g),
        "k": randn(batch, length, kv_heads, key_dim, seed_gen=g),
        "v": randn(batch, length, kv_heads, value_dim, seed_gen=g),
    }
    if mixer == "gla":
        x["log_decay"] = F.logsigmoid(randn(batch, length, heads, key_dim, seed_gen=g)) / 16
    if mixer in ("gdn", "deltanet"):
        x["beta"] = (2.0 if mixer == "deltanet" else 1.0) * torch.sigmoid(randn(batch, length, heads, seed_gen=g))
    if mixer == "gdn":
        x["log_decay"] = F.logsigmoid(randn(batch, length, heads, seed_gen=g) + 2.0)
    if mixer in RECURRENT:
        x["initial_state"] = randn(count, heads, key_dim, value_dim, seed_gen=g, scale=0.1)
    if mixer == "fox":
        x["log_forget"] = F.logsigmoid(randn(batch, length, heads, seed_gen=g) + 3.0)
    return x


# Gates kept in float32 at low precision, as the layers make them (fla's FoX and GDN gates
# are float32). GLA's gate follows the input dtype, as in fla's layer, except in packed
# cases, which cover a float32 gate with bfloat16 q/k/v. States are float32.
FLOAT32_INPUTS = ("log_forget", "initial_state")


def cast_inputs(x, mixer, dtype, device, mode="dense"):
    out = {}
    for name, t in x.items():
        gate32 = name == "log_decay" and (mixer == "gdn" or (mixer == "gla" and mode == "packed"))
        keep32 = name in FLOAT32_INPUTS or gate32
        out[name] = t.to(device=device, dtype=torch.float32 if keep32 and dtype != torch.float64 else dtype)
    return out


def call(mixer, x, backend, cu_seqlens=None, key_mask=None, q_len=None):
    """Run a mixer; returns ``(o, final_state or None)``."""
    if mixer == "gla":
        return gla(x["q"], x["k"], x["v"], x["log_decay"], initial_state=x.get("initial_state"),
                   output_final_state=True, cu_seqlens=cu_seqlens, backend=backend)  # fmt: skip
    if mixer in ("gdn", "deltanet"):
        return gated_delta_rule(x["q"], x["k"], x["v"], x["beta"], x.get("log_decay"), qk_l2norm=True,
                                initial_state=x.get("initial_state"), output_final_state=True,
                                cu_seqlens=cu_seqlens, backend=backend)  # fmt: skip
    q = x["q"] if q_len is None else x["q"][:, -q_len:]
    if mixer == "fox":
        return forgetting_attention(q, x["k"], x["v"], x["log_forget"], cu_seqlens=cu_seqlens, key_mask=key_mask, backend=backend), None
    if backend == "sdpa":  # the SDPA path itself, whatever "auto" would pick
        return sdpa_attention(q, x["k"], x["v"], q.shape[-1] ** -0.5, cu_seqlens, key_mask), None
    return softmax_attention(q, x["k"], x["v"], cu_seqlens=cu_seqlens, key_mask=key_mask, backend=backend), None


def _slice(x, start, stop):
    return {n: t if n == "initial_state" else t[:, start:stop] for n, t in x.items()}


def left_padding_mask(batch: int, length: int, device) -> torch.Tensor:
    lengths = torch.linspace(length, max(1, length // 3), batch).long()
    return torch.arange(length)[None, :] >= (length - lengths)[:, None]


# ----------------------------------------------------------------------------------------
# Running a case
# ----------------------------------------------------------------------------------------


def run_case(case: Case, *, batch: int, length: int, device="cuda", seed: int = 0, decode_steps: int = 3) -> dict:
    """Run one check; returns a JSON-able dict with the errors, the tolerance and ``passed``
    (None with a ``skipped`` reason when the case cannot run here)."""
    result = {"case": case.name, "mixer": case.mixer, "backend": case.backend, "impl": case.impl,
              "dtype": str(case.dtype).replace("torch.", ""), "mode": case.mode, "grad": case.grad,
              "tolerance": tolerance(case.dtype, case.impl)}  # fmt: skip
    if case.impl == "fla" and not fla_available():
        return result | {"passed": None, "skipped": "flash-linear-attention is not importable"}
    packed = case.mode == "packed"
    bounds = packed_bounds(length) if packed else None
    b = 1 if packed else batch
    count = len(bounds) - 1 if packed else b
    x64 = make_inputs(case.mixer, b, length, count, seed)
    if case.mode == "decode":
        return result | _decode(case, x64, device, decode_steps)
    cu = None if bounds is None else torch.tensor(bounds, dtype=torch.int32)
    mask = left_padding_mask(b, length, "cpu") if case.mode == "masked" else None

    low = {n: t.requires_grad_(case.grad) for n, t in cast_inputs(x64, case.mixer, case.dtype, device, case.mode).items()}
    ref_in = {n: t.detach().cpu().double().requires_grad_(case.grad) for n, t in low.items()}
    common._warned.discard("gdn-640")  # the fla #640 warning comes once per process: let this call show it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, final = call(case.mixer, low, case.backend, None if cu is None else cu.to(device),
                          None if mask is None else mask.to(device))  # fmt: skip
    ref_out, ref_final = call(case.mixer, ref_in, "torch", cu, mask)
    errors = {"o": rel_err(out.cpu(), ref_out)}
    if ref_final is not None:
        errors["final_state"] = rel_err(final.cpu(), ref_final)
    if case.backend == "auto" and case.mixer == "gdn" and case.impl == "torch":
        result["warned_640"] = any("#640" in str(w.message) for w in caught)
    if case.grad:
        g = generator(seed + 1)
        cot = [randn(*out.shape, seed_gen=g)] + ([] if ref_final is None else [randn(*ref_final.shape, seed_gen=g)])
        outs = [out] + ([] if ref_final is None else [final])
        names = list(low)
        grads = torch.autograd.grad(outs, [low[n] for n in names], [c.to(device=device, dtype=o.dtype) for c, o in zip(cot, outs)])
        ref_grads = torch.autograd.grad([ref_out] + ([] if ref_final is None else [ref_final]), [ref_in[n] for n in names], cot)
        for n, a, r in zip(names, grads, ref_grads):
            errors[f"d{n}"] = rel_err(a.cpu(), r)
    worst = max(errors.values())
    passed = worst < result["tolerance"] and all(math.isfinite(e) for e in errors.values())
    if "warned_640" in result:
        passed = passed and result["warned_640"]
    return result | {"errors": errors, "max_error": worst, "passed": passed}


def _decode(case: Case, x64, device, steps: int) -> dict:
    """Recurrent mixers: prefill, then one token at a time carrying the state. Attention:
    one query at each of the last positions against the cache of keys (left-padded rows)."""
    length = x64["q"].shape[1]
    low = cast_inputs(x64, case.mixer, case.dtype, device)
    ref_in = {n: t.cpu().double() for n, t in low.items()}
    outputs = []
    with torch.no_grad():
        if case.mixer in RECURRENT:
            ref_out, ref_final = call(case.mixer, ref_in, "torch")
            prefix = length - steps
            out, state = call(case.mixer, _slice(low, 0, prefix), case.backend)
            outputs.append(out)
            for t in range(prefix, length):
                out, state = call(case.mixer, _slice(low, t, t + 1) | {"initial_state": state}, case.backend)
                outputs.append(out)
            errors = {"o": rel_err(torch.cat(outputs, 1).cpu(), ref_out), "final_state": rel_err(state.cpu(), ref_final)}
        else:
            mask = left_padding_mask(x64["q"].shape[0], length, "cpu")
            ref_out, _ = call(case.mixer, ref_in, "torch", key_mask=mask)
            for p in range(length - steps, length):
                step = _slice(low, 0, p + 1)
                outputs.append(call(case.mixer, step, case.backend, key_mask=mask[:, : p + 1].to(device), q_len=1)[0])
            errors = {"o": rel_err(torch.cat(outputs, 1).cpu(), ref_out[:, -steps:])}
    tol = tolerance(case.dtype, case.impl)
    worst = max(errors.values())
    return {"errors": errors, "max_error": worst, "passed": worst < tol and all(math.isfinite(e) for e in errors.values())}


def gdn_fla_training_refused(device="cuda") -> dict:
    """Where fla #640 applies: ``backend="fla"`` with gradients must raise up front."""
    x = cast_inputs(make_inputs("gdn", 1, 80, 1, seed=5), "gdn", torch.bfloat16, device)
    x = {n: t.requires_grad_() for n, t in x.items()}
    try:
        call("gdn", x, "fla")
    except RuntimeError as error:
        return {"raised": True, "message": str(error)[:200]}
    return {"raised": False}
