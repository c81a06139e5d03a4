"""lm-evaluation-harness (0.4.x) on an srope model.

lm-eval has no plugin discovery for model classes, so ``srope lm-eval`` imports
:mod:`srope.models` (which registers ``model_type = "srope"`` with transformers' Auto
classes) and then runs lm-eval's own ``run`` command in the same process with
``--model hf --model_args pretrained=DIR,...``. lm-eval's Hugging Face wrapper (HFLM) then
loads our model and the tokenizer saved beside it from the folder, and everything lm-eval
does (loglikelihood, loglikelihood_rolling, generate_until with ``model.generate`` and our
own cache, batching, results and sample files) is lm-eval's.

The model folder is checked first as ``srope eval`` checks it: a ``config.json`` of another
``model_type``, or one that disagrees with the weights, is refused before lm-eval starts.

What we set in ``--model_args`` (any of them can be overridden with ``--model-args``):

* ``backend=causal`` (HFLM cannot tell from an unknown model type);
* ``dtype=float32``: the weights stay as trained; ``--dtype bfloat16`` (or ``auto`` on CUDA)
  adds ``mixed_precision_dtype=bfloat16`` (autocast, like training) and
  ``softmax_dtype=float32`` (log-softmax of the logits in float32);
* ``max_length=<training context>`` read from the run's ``train_config.json`` when present
  (lm-eval would otherwise take ``max_position_embeddings``); rolling-perplexity tasks
  (wikitext) score documents in windows of this many tokens.

Batches: loglikelihood requests are right-padded by lm-eval, and a causal model's logits at
real positions do not depend on later padding; generation batches are left-padded with an
``attention_mask``, which our models honour. The saved tokenizer prepends ``<s>`` (as
Mistral's does), pads with ``</s>`` on the left, and lm-eval pads loglikelihood batches itself.

Rolling perplexity (wikitext) is lm-eval's as it stands: its HFLM encodes each document with
the tokenizer's ``<s>`` and then puts its own prefix token (``<s>`` again) in front, so the
model reads ``<s> <s> text`` and the first ``<s>`` is scored as a target, which raises word
perplexity a little against a single ``<s>``. Any model whose tokenizer adds
``<s>`` (the paper's Mistral tokenizer among them) is scored this way by stock lm-eval, so we
keep it for comparability; ``--model-args add_bos_token=False`` on a rolling task run alone
gives the single-``<s>`` number (not on multiple-choice tasks, whose contexts then lose ``<s>``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

PAPER_TASKS = ("wikitext", "lambada_openai", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge")


def _check_positive(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def model_args(model: str | os.PathLike, *, dtype: str = "auto", device: str = "auto", max_length: int | None = None, extra: dict | None = None) -> dict:
    """lm-eval's HFLM arguments for the srope model folder ``model`` (or a run folder), checked
    as ``srope eval`` checks it (:func:`srope.lab.eval.model_dir.check_model`)."""
    from srope.lab.eval.model_dir import autocast_dtype, check_model, find_train_config, resolve_device, resolve_model_dir

    folder = resolve_model_dir(model)
    check_model(folder)
    where = resolve_device(device)
    args: dict = {"pretrained": str(folder.resolve()), "backend": "causal", "dtype": "float32"}
    if autocast_dtype(dtype, where) is not None:
        args |= {"mixed_precision_dtype": "bfloat16", "softmax_dtype": "float32"}
    _check_positive("max_length", max_length)
    if max_length is None:
        max_length = (find_train_config(folder) or {}).get("seq_len")
    if max_length:
        args["max_length"] = int(max_length)
    return args | dict(extra or {})


def parse_model_args(text: str | None) -> dict:
    """``key=value,key=value`` (lm-eval's syntax) into a dict of strings."""
    if not text:
        return {}
    out = {}
    for pair in text.split(","):
        if "=" not in pair:
            raise ValueError(f"--model-args takes key=value[,key=value...], got {pair!r}")
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


def lm_eval_argv(
    model: str | os.PathLike,
    tasks: str | list[str],
    *,
    limit: float | None = None,
    batch_size: str | int = 1,
    device: str = "auto",
    dtype: str = "auto",
    max_length: int | None = None,
    output_path: str | os.PathLike | None = None,
    num_fewshot: int | None = None,
    include_path: str | os.PathLike | None = None,
    log_samples: bool = False,
    gen_kwargs: str | None = None,
    seed: str | None = None,
    extra_model_args: dict | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """lm-eval's command-line arguments (``lm-eval ARGS``, the form every 0.4.x accepts) for an srope model."""
    from srope.lab.eval.model_dir import resolve_device

    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t.strip()]
    if not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise ValueError(f"tasks must name at least one lm-eval task (comma-separated), got {tasks!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
        raise ValueError(f"limit must be a positive number (a count, or a fraction < 1), got {limit!r}")
    if isinstance(batch_size, bool) or not re.fullmatch(r"[1-9][0-9]*|auto(:[1-9][0-9]*)?", str(batch_size)):
        raise ValueError(f"batch_size must be a positive integer or 'auto[:N]', got {batch_size!r}")
    if num_fewshot is not None and (isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int) or num_fewshot < 0):
        raise ValueError(f"num_fewshot must be a non-negative integer, got {num_fewshot!r}")
    args = model_args(model, dtype=dtype, device=device, max_length=max_length, extra=extra_model_args)
    bad = [f"{k}={v}" for k, v in args.items() if "," in str(v) or "=" in str(v)]
    if bad:
        raise ValueError(f"model arguments may not contain ',' or '=' (lm-eval splits on them): {bad}")
    argv = ["--model", "hf", "--model_args", ",".join(f"{k}={v}" for k, v in args.items()), "--tasks", ",".join(t.strip() for t in tasks)]
    argv += ["--batch_size", str(batch_size), "--device", str(resolve_device(device))]
    if limit is not None:
        argv += ["--limit", str(limit)]
    if output_path is not None:
        argv += ["--output_path", os.fspath(output_path)]
    if num_fewshot is not None:
        argv += ["--num_fewshot", str(num_fewshot)]
    if include_path is not None:
        if not Path(include_path).is_dir():
            raise ValueError(f"include_path must be a folder of lm-eval task YAML files, got {os.fspath(include_path)!r}")
        argv += ["--include_path", os.fspath(include_path)]
    if log_samples:
        if output_path is None:
            raise ValueError("log_samples needs an output_path (lm-eval writes the samples there)")
        argv += ["--log_samples"]
    if gen_kwargs:
        argv += ["--gen_kwargs", gen_kwargs]
    if seed is not None:
        argv += ["--seed", str(seed)]
    return argv + list(extra or [])


def run_lm_eval(argv: list[str]) -> None:
    """Run lm-eval's command line (``lm-eval`` + ``argv``) in this process, with srope's models registered."""
    try:
        import accelerate  # noqa: F401  (lm-eval's HFLM needs it)
        from lm_eval.__main__ import cli_evaluate
    except ImportError as err:
        raise ImportError(f"srope lm-eval needs lm-eval 0.4.x and accelerate ({err}): pip install 'srope[eval]'") from err
    import srope.models  # noqa: F401  (registers model_type "srope" with the Auto classes)

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
