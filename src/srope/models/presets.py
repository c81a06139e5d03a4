"""Named model configurations with their training defaults: :data:`PRESETS` is
:data:`srope.registry.model_presets` (kept there, torch-free, so that ``srope train`` refuses a
misspelt preset before torch loads; the presets and their sources are described there)."""

from __future__ import annotations

from typing import Any

from srope.models.configuration import SRopeConfig
from srope.registry import Preset, TrainingDefaults
from srope.registry import model_presets as PRESETS


def preset_config(name: str, position: Any = None, **overrides) -> SRopeConfig:
    """The ``SRopeConfig`` of preset ``name`` with ``position`` and any field overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return SRopeConfig(**{**PRESETS[name].config, "position": position, **overrides})


__all__ = ["PRESETS", "Preset", "TrainingDefaults", "preset_config"]
