"""``SRopeForCausalLM``: token ids → embedding → blocks (norm → mixer → norm → SwiGLU) → head.

Generation carries an :class:`SRopeCache`: per layer the mixer's recurrent state or KV
cache, its short-conv states and the position encoding's state. It works with
``model.generate`` (we build the cache ourselves, so transformers' own cache classes are
never involved) and with a plain loop of cached forward calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from srope.layers import GatedDeltaNet
from srope.layers.common import RMSNorm
from srope.models.cache import CACHE_FIELD, SRopeCache
from srope.models.configuration import SRopeConfig
from srope.models.embedding import Embedding
from srope.models.graphed_decode import DecodeGraphs
from srope.models.inputs import check_extra_kwargs, check_output_flags, packing
from srope.modules import PositionEncoding, ShortConvolution
from srope.ops.loss import summed_cross_entropy
from srope.ops.checks import check_cu_seqlens
from srope.ops.fused import swiglu
from srope.ops.layout import RowLayout
from srope.registry import mixers


def build_mixer(config: SRopeConfig) -> nn.Module:
    """The host layer of ``config.mixer`` (:data:`srope.registry.mixers`) with ``config.position``."""
    return mixers[config.mixer].cls().from_config(config)


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, inner_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, inner_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, inner_size, bias=False)
        self.down_proj = nn.Linear(inner_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class SRopeBlock(GradientCheckpointingLayer):
    """norm → mixer → norm → SwiGLU, with residuals. Under ``gradient_checkpointing_enable()``
    transformers recomputes it in the backward (h is positional for that: only positional
    inputs carry gradients through a reentrant checkpoint)."""

    def __init__(self, config: SRopeConfig):
        super().__init__()
        self.mixer_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mixer = build_mixer(config)
        has_mlp = config.mlp_size() > 0
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.norm_eps) if has_mlp else None
        self.mlp = SwiGLU(config.hidden_size, config.mlp_size()) if has_mlp else None

    def forward(self, h, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None):
        out, state = self.mixer(
            self.mixer_norm(h), attention_mask=attention_mask, cu_seqlens=cu_seqlens, state=state, use_cache=use_cache, layout=layout
        )
        if self.mlp is None:
            return h + out, state
        x, h = self.mlp_norm(out, residual=h)  # h + out, and its norm, in one kernel on CUDA
        return h + self.mlp(x), state


def _output(cls, cache, **fields):
    return cls(**fields, **{CACHE_FIELD: cache})


class SRopePreTrainedModel(PreTrainedModel):
    config_class = SRopeConfig
    base_model_prefix = "model"
    _no_split_modules = ["SRopeBlock"]
    supports_gradient_checkpointing = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """fla's scheme for the host (N(0, initializer_range) linear maps and embeddings, zero
        biases, unit norms); position encodings, short convs and GDN's decay parameters keep
        their own initialisation (``reset_parameters`` / ``reset_decay``)."""
        if isinstance(module, (PositionEncoding, ShortConvolution)):
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
            return
        if getattr(module, "_srope_self_initialised", False):
            return
        if isinstance(module, GatedDeltaNet):
            module.reset_decay()
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        elif isinstance(module, nn.RMSNorm) and module.weight is not None:
            nn.init.ones_(module.weight)

    def mark_self_initialised(self) -> None:
        """Tell ``_init_weights`` to leave the insides of position encodings alone."""
        for module in self.modules():
            if isinstance(module, PositionEncoding):
                for inner in module.modules():
                    if inner is not module:
                        inner._srope_self_initialised = True


class SRopeModel(SRopePreTrainedModel):
    def __init__(self, config: SRopeConfig):
        super().__init__(config)
        self.embeddings = Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(SRopeBlock(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mark_self_initialised()
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: SRopeCache | None = None,
        past_key_values: SRopeCache | None = None,
        use_cache: bool | None = None,
        cu_seqlens: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        check_extra_kwargs(kwargs, "SRopeModel.forward")
        check_output_flags(output_attentions, return_dict)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids [B, T] and inputs_embeds [B, T, hidden]")
        if inputs_embeds is not None and not inputs_embeds.is_floating_point():
            raise TypeError(f"inputs_embeds must be floating point [B, T, hidden], got {inputs_embeds.dtype}")
        h = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if h.dim() != 3:
            raise ValueError(f"input_ids must be [B, T] (inputs_embeds [B, T, hidden]), got {tuple(h.shape[:-1])}")
        batch, length = h.shape[:2]
        cache = cache if cache is not None else past_key_values
        if length < 1:
            raise ValueError("input_ids must hold at least one token per row (T >= 1)")
        if cache is not None and not isinstance(cache, SRopeCache):
            raise TypeError(f"cache must be an SRopeCache (returned by a previous call), got {type(cache).__name__}")
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"the cache holds {len(cache)} layers, this model has {len(self.layers)}")
        cu_seqlens = packing(position_ids, cu_seqlens, attention_mask, h, 0 if cache is None else cache.seen_tokens)
        if use_cache is None:  # a cache only where one is useful: inference on unpacked batches
            use_cache = self.config.use_cache and not self.training and cu_seqlens is None
        if use_cache and self.training and torch.is_grad_enabled() and any(layer.gradient_checkpointing for layer in self.layers):
            # transformers' checkpointed blocks would drop use_cache and leave the cache without states
            raise ValueError("use_cache=True cannot be combined with gradient checkpointing in training: pass use_cache=False or call model.eval()")
        if use_cache and cache is None:
            cache = SRopeCache(len(self.layers))
        if cu_seqlens is not None:
            check_cu_seqlens(cu_seqlens, batch, length)
            if attention_mask is not None:
                raise ValueError("pass either attention_mask or cu_seqlens, not both")
        mask = self._current_mask(attention_mask, batch, length, cache)
        # the batch described once, for every layer and encoding (host syncs on a padded or packed batch)
        layout = RowLayout(batch, length, attention_mask=mask, cu_seqlens=cu_seqlens, device=h.device)
        hidden_states = []
        for i, layer in enumerate(self.layers):
            if output_hidden_states:
                hidden_states.append(h)
            state = None if cache is None else cache.layers[i]
            h, state = layer(h, attention_mask=mask, cu_seqlens=cu_seqlens, state=state, use_cache=use_cache, layout=layout)
            if use_cache:
                cache.layers[i] = state
        if use_cache:
            cache.seen_tokens += length
        h = self.norm(h)
        out = _output(BaseModelOutputWithPast, cache if use_cache else None, last_hidden_state=h,
                      hidden_states=(*hidden_states, h) if output_hidden_states else None)  # fmt: skip
        return out if return_dict is not False else out.to_tuple()

    @staticmethod
    def _current_mask(attention_mask, batch, length, cache):
        """The ``[B, T]`` mask of this call's tokens (generate passes the whole history), or None."""
        if attention_mask is None:
            return None
        if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
            raise ValueError(f"attention_mask must be [B, T] or [B, past + T] with B = {batch}, T = {length}; got {tuple(attention_mask.shape)}")
        past = 0 if cache is None else cache.seen_tokens
        if attention_mask.shape[1] not in (length, past + length):
            raise ValueError(f"attention_mask has {attention_mask.shape[1]} columns; expected {length} or past + T = {past + length}")
        mask = attention_mask[:, -length:]
        return mask if torch.compiler.is_compiling() or not bool(mask.all()) else None  # compiled: no host sync


class SRopeForCausalLM(SRopePreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}
    accepts_loss_kwargs = True  # the Trainer's num_items_in_batch: the loss is then scaled for gradient accumulation here

    def __init__(self, config: SRopeConfig):
        super().__init__(config)
        self.model = SRopeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decode_graphs = True  # replay one-token decoding from CUDA graphs where it applies (graphed_decode.py)
        self._decode_graphs = DecodeGraphs(self)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # we bring our own cache (SRopeCache)

    def get_input_embeddings(self):
        return self.model.embeddings

    def set_input_embeddings(self, value):
        self.model.embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: SRopeCache | None = None,
        past_key_values: SRopeCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        cu_seqlens: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        targets: torch.LongTensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Labels are shifted inside (pass ``labels=input_ids``); -100 is ignored, and with
        ``cu_seqlens`` no token predicts the first token of the next document.

        ``targets [B, T]`` (already shifted: ``targets[:, t]`` follows ``input_ids[:, t]``;
        -100 ignored) returns the *summed* token loss instead of logits, from the final hidden
        states (:func:`srope.ops.loss.summed_cross_entropy`: fused on CUDA, the logits never
        materialised); it is what ``srope train`` optimises.

        ``position_ids`` are checked, not used: the positions the model counts itself pass, a
        single row's positions that restart at 0 become ``cu_seqlens`` (Hugging Face's
        flattening collators), anything else is refused. ``num_items_in_batch`` (the
        ``Trainer``'s count of targets over the accumulated batches) makes the loss their sum
        divided by it, as transformers' own causal-LM loss does."""
        check_extra_kwargs(kwargs, "SRopeForCausalLM.forward")
        check_output_flags(output_attentions, return_dict)
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be an integer >= 0 (0: every position), got {logits_to_keep!r}")
        cache = cache if cache is not None else past_key_values
        rows = input_ids if input_ids is not None else inputs_embeds
        cu_seqlens = packing(position_ids, cu_seqlens, attention_mask, rows, 0 if cache is None else cache.seen_tokens)
        plain = not output_hidden_states and return_dict is not False  # what the captured decode step returns
        if plain and self._decode_graphs.applies(input_ids, cache, attention_mask=attention_mask, inputs_embeds=inputs_embeds, labels=labels,
                                       cu_seqlens=cu_seqlens, use_cache=use_cache):  # fmt: skip
            return _output(CausalLMOutputWithPast, cache, logits=self._decode_graphs.step(input_ids, cache))
        out = self.model(
            input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, cache=cache,
            past_key_values=past_key_values, use_cache=use_cache, cu_seqlens=cu_seqlens, output_hidden_states=output_hidden_states,
        )
        hidden = out.last_hidden_state
        if targets is not None:
            if labels is not None:
                raise ValueError("pass labels (mean loss, shifted inside) or targets (summed loss, already shifted), not both")
            loss = summed_cross_entropy(hidden, self.lm_head.weight, targets)
            result = _output(CausalLMOutputWithPast, getattr(out, CACHE_FIELD), loss=loss, logits=None, hidden_states=out.hidden_states)
            return result if return_dict is not False else result.to_tuple()
        logits = self.lm_head(hidden if not logits_to_keep else hidden[:, -logits_to_keep:])
        loss = None
        if labels is not None:
            loss = causal_lm_loss(logits, labels, cu_seqlens, num_items_in_batch)
        result = _output(CausalLMOutputWithPast, getattr(out, CACHE_FIELD), loss=loss, logits=logits, hidden_states=out.hidden_states)
        return result if return_dict is not False else result.to_tuple()

    def prepare_inputs_for_generation(self, input_ids, cache=None, past_key_values=None, attention_mask=None, inputs_embeds=None, use_cache=True, **kwargs):
        cache = cache if cache is not None else past_key_values
        if (cache is None or cache.seen_tokens == 0) and attention_mask is not None and not bool(attention_mask[:, -1].all()):
            raise ValueError("generate continues every row from its last token: pad prompts on the left (tokenizer.padding_side = 'left')")
        if cache is None and inputs_embeds is not None and use_cache:
            # The prompt comes as embeddings: input_ids will hold only the generated tokens.
            cache = SRopeCache(len(self.model.layers))
            cache.embedded_prompt = inputs_embeds.shape[1] - input_ids.shape[1]
        if cache is not None and cache.seen_tokens > 0:
            input_ids = input_ids[:, cache.seen_tokens - cache.embedded_prompt :]
        elif inputs_embeds is not None:
            return {"inputs_embeds": inputs_embeds, "attention_mask": attention_mask, "use_cache": use_cache, "cache": cache}
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": use_cache, "cache": cache}
        if kwargs.get("logits_to_keep") is not None:
            inputs["logits_to_keep"] = kwargs["logits_to_keep"]
        return inputs


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                   num_items_in_batch: int | torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Mean next-token cross-entropy (float32), targets ``labels[:, 1:]``; -100 ignored; with
    ``cu_seqlens`` the target at every document start is ignored too. With
    ``num_items_in_batch`` the summed cross-entropy divided by it."""
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels must be [B, T] = {tuple(logits.shape[:2])}, got {tuple(labels.shape)}")
    targets = labels[:, 1:]
    if cu_seqlens is not None:  # target j is token j + 1: ignored where a document starts there
        # (a fixed-shape mask rather than boolean indexing, which breaks a compiled graph)
        positions = torch.arange(1, labels.shape[1], device=labels.device)
        targets = targets.masked_fill(torch.isin(positions, cu_seqlens[1:-1].to(labels.device, torch.long)), -100)
    if num_items_in_batch is None:
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
    summed = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum")
    return summed / (num_items_in_batch.to(summed.device) if isinstance(num_items_in_batch, torch.Tensor) else num_items_in_batch)
