"""How a synthetic run initialises and stores its model: srope's choices, or a release's.

``init``:
- ``"model"``: the model's own initialisation (``SRopeForCausalLM``: fla's scheme for the host,
  PyTorch's defaults inside the position encodings; the Zoology model: Zoology's).
- ``"release"``: the authors' Hugging Face ``_init_weights`` (``src/selective_rope/models/*/
  modeling.py``): every linear map and every convolution, the position encoding's and the
  host's short convs included, N(0, 0.02) with zero bias; embeddings N(0, 0.02). Parameters of
  other kinds keep the model's own values.

``precision``:
- ``"autocast"``: float32 weights, bf16 autocast on CUDA, float32 elsewhere (srope's default;
  the copying release's ``mix_precision``).
- ``"float32"``: no autocast anywhere (Zoology).
- ``"bf16"``: weights cast to bf16 (``model.to(torch.bfloat16)``, as the state-tracking release
  does) and bf16 autocast on CUDA. Fixed temperature spectra are computed from the config and
  stay unquantised, unlike the release's bf16 temperature parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from srope.modules import ShortConvolution

INITS = ("model", "release")
PRECISIONS = ("autocast", "float32", "bf16")


def check(init: str, precision: str) -> None:
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


@torch.no_grad()
def initialise(model: nn.Module, init: str, std: float = 0.02) -> None:
    """Re-initialise ``model`` by ``init`` (``"model"`` leaves it as built)."""
    if init == "model":
        return
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, ShortConvolution)) and isinstance(getattr(module, "weight", None), nn.Parameter):
            nn.init.normal_(module.weight, std=std)  # (the fixed first difference has no weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)


def store(model: nn.Module, precision: str) -> nn.Module:
    """The model in the dtype its weights are trained in."""
    return model.to(torch.bfloat16) if precision == "bf16" else model


def autocast(device: torch.device, precision: str = "autocast"):
    """The forward's autocast context: bf16 on CUDA unless ``precision == "float32"``."""
    if device.type == "cuda" and precision != "float32":  # no weight-cast cache: a CUDA graph capture needs none
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
    return torch.autocast(device.type, enabled=False)
