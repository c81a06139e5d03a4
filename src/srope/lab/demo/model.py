"""The demo's model (one GLA per position encoding, sharing every common weight) and the
angle steps its Selective RoPE learned."""

from __future__ import annotations

import math
from typing import Any

import torch

from srope.lab.demo.config import GROUP, DemoConfig
from srope.lab.tasks import state_tracking
from srope.lab.tasks.groups import get_group
from srope.ops.layout import RowLayout


def build_model(config: DemoConfig, kind: str, seed: int) -> torch.nn.Module:
    """The GLA of ``config`` with position encoding ``kind``.

    Every weight that the three encodings have in common starts from the same values for
    a given seed (those of the NoPE model); only the encoding's own parameters differ.
    """
    from srope.models import SRopeConfig, SRopeForCausalLM

    def make(position: str) -> torch.nn.Module:
        torch.manual_seed(seed)
        cfg = SRopeConfig(vocab_size=state_tracking.vocab_size(get_group(GROUP)), mixer="gla", position=config.position(position),
                          bos_token_id=None, eos_token_id=None, **config.model)
        return SRopeForCausalLM(cfg)

    model = make(kind)
    if kind != "nope":
        shared = make("nope").state_dict()
        missing, unexpected = model.load_state_dict(shared, strict=False)
        if unexpected or any(".position." not in name for name in missing):
            raise RuntimeError(f"NoPE and {kind} models differ outside the position encoding: {missing=} {unexpected=}")
    return model


@torch.no_grad()
def encoding_input(model: torch.nn.Module, encoding: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """The block input x from which ``encoding`` (one of the model's) computes its angles,
    in one forward of ``tokens``."""
    seen = {}

    def capture(module, args, kwargs):  # the call is encoding(q, k, x, ...)
        seen["x"] = args[2] if len(args) > 2 else kwargs["x"]

    hook = encoding.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        model(torch.tensor([tokens], device=next(model.parameters()).device))
    finally:
        hook.remove()
    return seen["x"]


@torch.no_grad()
def parity_angles(model: torch.nn.Module, eval_len: int) -> dict[str, Any] | None:
    """The angle step each token makes in the rotation pair closest to parity's exact
    solution (π per "1", 0 per "0", modulo 2π), how far off it is (radians), and the drift
    those errors add up to over ``eval_len`` uniform bits (``eval_len / 2`` of each).

    A step off by ε adds ε per token, so a run whose steps are right to within the
    tolerance at the training length can still be wrong at 4x it. None for models
    without Selective RoPE. In the one-layer demo model the angles depend on the token
    alone (conv width 1), so ``[BOS, 0, 1]`` shows every step there is."""
    from srope.modules.selective_rope import SelectiveRoPE

    encodings = [m for m in model.modules() if isinstance(m, SelectiveRoPE)]
    if len(encodings) != 1:
        return None
    encoding = encodings[0]
    tokens = [state_tracking.bos_id(get_group(GROUP)), 0, 1]
    model.eval()
    phi, _ = encoding.phase_increments(encoding_input(model, encoding, tokens), RowLayout(1, len(tokens)))
    angles = (phi[0].double() * encoding.temperature(torch.float64, phi.device)).flatten(1).cpu()  # [3, Hk·R]
    wrap = lambda a: torch.remainder(a + math.pi, 2 * math.pi) - math.pi  # noqa: E731 - into [-π, π)
    off_one, off_zero = wrap(angles[2] - math.pi), wrap(angles[1])
    pair = int((off_one.abs() + off_zero.abs()).argmin())
    errors = float(off_one[pair]), float(off_zero[pair])
    return {"pair": pair, "step_per_one": float(angles[2, pair]), "step_per_zero": float(angles[1, pair]),
            "error_per_one": errors[0], "error_per_zero": errors[1], "drift_at_eval_len": eval_len / 2 * sum(errors)}
