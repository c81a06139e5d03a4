"""Hugging Face causal LMs over every host × position encoding, registered with the Auto
classes under ``model_type = "srope"``."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from srope.models.configuration import SRopeConfig
from srope.models.cache import SRopeCache
from srope.models.modeling import SRopeForCausalLM, SRopeModel, causal_lm_loss
from srope.models.presets import PRESETS, Preset, preset_config

AutoConfig.register(SRopeConfig.model_type, SRopeConfig, exist_ok=True)
AutoModel.register(SRopeConfig, SRopeModel, exist_ok=True)
AutoModelForCausalLM.register(SRopeConfig, SRopeForCausalLM, exist_ok=True)

__all__ = ["PRESETS", "Preset", "SRopeCache", "SRopeConfig", "SRopeForCausalLM", "SRopeModel", "causal_lm_loss", "preset_config"]
