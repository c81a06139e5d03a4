"""The trained model's folder: weights, config and a tokenizer ready for batched generation."""

from __future__ import annotations

from pathlib import Path

from srope.lab.train.distributed import World, unwrap


def export_model(model, corpus, path: Path, world: World) -> None:
    """``save_pretrained`` the final weights, config and tokenizer (loadable with
    ``AutoModelForCausalLM.from_pretrained`` after ``import srope``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.is_main:
        bare = unwrap(model)
        tokenizer = generation_tokenizer(corpus.path / "tokenizer")
        bare.generation_config.pad_token_id = tokenizer.pad_token_id
        bare.save_pretrained(path, state_dict=state)
        tokenizer.save_pretrained(path)
        (path / "README.md").write_text(MODEL_CARD)
    world.barrier()


# transformers knows model_type "srope" only once srope.models is imported; without it, it
# suggests upgrading transformers. The folder says so itself.
MODEL_CARD = """# An srope model

Trained with `srope train`. Load it after importing `srope.models`, which registers the
`srope` model type with transformers:

```python
import srope.models
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER")
tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")  # pads with eos, on the left
```
"""


def generation_tokenizer(folder: Path):
    """The tokenizer saved in ``folder`` as batched generation needs it: a pad token (eos when
    it has none; the attention mask hides padding) and padding on the left, where a causal
    model ignores it (``padding_side`` is saved only when given at load time)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, padding_side="left")
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token to pad batches with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
