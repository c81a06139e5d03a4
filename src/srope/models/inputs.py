"""The Hugging Face keyword arguments the models accept beyond their own, checked.

The models take ``**kwargs`` so that ``generate`` and the ``Trainer`` can pass what they pass;
anything else is refused rather than dropped, since a dropped ``position_ids`` (a packed batch
from ``DataCollatorWithFlattening``) would silently run the documents as one sequence.
"""

from __future__ import annotations

import torch

IGNORED = frozenset({"cache_position"})  # generate passes it; SRopeCache counts the tokens itself


def check_extra_kwargs(kwargs: dict, where: str) -> None:
    unknown = sorted(set(kwargs) - IGNORED)
    if unknown:
        raise TypeError(f"{where} got unexpected keyword arguments {unknown} (packed documents: pass cu_seqlens, or position_ids that restart at 0)")


def check_output_flags(output_attentions: bool | None, return_dict: bool | None) -> None:
    if output_attentions:
        raise ValueError("output_attentions is not available: the linear-attention hosts form no attention weights")
    if return_dict is not None and not isinstance(return_dict, bool):
        raise TypeError(f"return_dict must be a bool, got {type(return_dict).__name__}")


def cu_seqlens_from_position_ids(position_ids: torch.Tensor, attention_mask: torch.Tensor | None, batch: int, length: int, past: int) -> torch.Tensor | None:
    """What ``position_ids [B, T]`` say about the batch: None where they are the positions the
    model derives itself (``past .. past+T-1``, or counted over the real tokens of
    ``attention_mask``), the ``cu_seqlens`` of the documents where a single row's positions
    restart at 0 (Hugging Face's flattening collators); anything else is refused."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dtype.is_floating_point or tuple(position_ids.shape) != (batch, length):
        shape = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids must be an integer tensor [B, T] = [{batch}, {length}], got {shape}")
    positions = position_ids.long()
    if attention_mask is not None:
        real = attention_mask.long()
        counted = (real.cumsum(-1) - 1)[:, -length:]
        real = real[:, -length:].bool()
        if bool(((positions == counted) | ~real).all()):
            return None
    elif bool((positions == torch.arange(past, past + length, device=positions.device)).all()):
        return None
    if batch == 1 and past == 0 and attention_mask is None:
        row, steps = positions[0], torch.arange(length, device=positions.device)
        starts = steps[row == 0]
        if starts.numel() and int(starts[0]) == 0 and torch.equal(row, steps - starts[(row == 0).cumsum(0) - 1]):
            return torch.cat([starts, starts.new_tensor([length])]).to(torch.int32)
    raise ValueError(
        "position_ids must be the positions the model counts itself (past .. past+T-1, or over the real tokens of attention_mask) "
        "or, for one packed row, restart at 0 at each document; the model derives positions from the batch: pass attention_mask or cu_seqlens"
    )


def packing(position_ids: torch.Tensor | None, cu_seqlens: torch.Tensor | None, attention_mask: torch.Tensor | None, rows: torch.Tensor,
            past: int) -> torch.Tensor | None:  # fmt: skip
    """The call's ``cu_seqlens``: as given, or from ``position_ids`` that restart per document
    (``rows``: the input ids or embeddings, for B and T; ``past``: tokens already cached)."""
    if position_ids is None or rows is None:  # no rows: the model refuses the call
        return cu_seqlens
    packed = cu_seqlens_from_position_ids(position_ids, attention_mask, *rows.shape[:2], past)
    if packed is not None and cu_seqlens is not None:
        raise ValueError("pass either cu_seqlens or position_ids that restart at each document, not both")
    return cu_seqlens if packed is None else packed
