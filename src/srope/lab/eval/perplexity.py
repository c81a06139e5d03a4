"""Held-out perplexity, perplexity by position, and length extrapolation.

``srope eval --model RUN/model --data SOURCE [--split test|val] [--out FILE.json]`` scores a
held-out split of the corpus at several context lengths (default 1×, 2× and 4× the training
context read from the run's ``train_config.json``, those that fit the split: a context ``L``
needs ``L + 1`` tokens for one row). Every context length scores the **same targets**: the first
``N`` tokens after the first of the split's token stream (documents concatenated), with ``N``
a multiple of the longest context (all of the split, or ``--max-rows`` rows of the longest
context), cut into rows of ``L`` inputs; so the numbers differ only in how much context
the model has, and positions at or beyond the training length show the extrapolation.

The split is ``test`` by default: training measures ``val`` and learning rates are chosen on
it, so a perplexity reported there would be optimistic. A store whose ``test`` split is empty
(a source of a few documents) is scored on ``val`` instead, with a warning; the result's
``data.split`` names the split actually scored, ``data.source`` the absolute path of a local
source (``srope train`` records local paths absolute, so a run's data is found from any directory).

For each context ``L`` the result holds the mean token loss and ``ppl = exp(loss)``, the
same split into positions below and at/after the training length, and the mean loss per
bucket of positions (``bucket_size`` wide; a curve). Position ``t`` is the offset of the
input token within its row (``packing="concat"``, the paper's setting: the state runs across
document boundaries inside a row) or within its document segment (``packing="documents"``:
every document start restarts the model through ``cu_seqlens``, and the target that would be
the next document's first token is not scored).

Logits are computed chunk by chunk over time from the final hidden states, so long contexts
never hold a ``[B, L, vocab]`` tensor. The loss is accumulated in float64.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from srope.lab import provenance
from srope.lab.train.batches import IGNORE_INDEX, PACKING, eval_batches
from srope.lab.train.token_store import TokenStore

LOGIT_CHUNK = 1024  # time steps per lm_head + cross-entropy chunk
EVAL_SPLITS = ("test", "val")  # the first is the default


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


@dataclass
class PositionLoss:
    """Summed loss and target count per position ``0..L-1`` (float64 / int64 numpy arrays)."""

    loss_sum: np.ndarray
    count: np.ndarray

    @classmethod
    def zeros(cls, length: int) -> PositionLoss:
        return cls(np.zeros(length, dtype=np.float64), np.zeros(length, dtype=np.int64))

    @property
    def targets(self) -> int:
        return int(self.count.sum())

    def mean(self, start: int = 0, stop: int | None = None) -> float | None:
        count = int(self.count[start:stop].sum())
        return float(self.loss_sum[start:stop].sum() / count) if count else None

    def buckets(self, size: int) -> dict:
        """Mean loss over positions ``[start, start + size)``; empty buckets are left out."""
        starts, losses, counts = [], [], []
        for start in range(0, len(self.count), size):
            count = int(self.count[start : start + size].sum())
            if count:
                starts.append(start)
                losses.append(float(self.loss_sum[start : start + size].sum() / count))
                counts.append(count)
        return {"bucket_size": size, "start": starts, "loss": losses, "targets": counts}


def _segment_positions(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Offset of every packed position from the start of its segment."""
    index = torch.arange(total, device=cu_seqlens.device)
    starts = cu_seqlens[:-1].long()
    segment = torch.searchsorted(starts, index, right=True) - 1
    return index - starts[segment]


@torch.no_grad()
def token_losses(model, input_ids: torch.Tensor, labels: torch.Tensor, *, cu_seqlens: torch.Tensor | None = None, autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per-token cross-entropy ``[B, T]`` (float32; 0 where the label is ``IGNORE_INDEX``).

    ``labels`` are the targets already shifted (``labels[:, t]`` follows ``input_ids[:, t]``).
    """
    device = input_ids.device
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        hidden = model.model(input_ids, cu_seqlens=cu_seqlens, use_cache=False).last_hidden_state
        out = torch.empty(labels.shape, dtype=torch.float32, device=device)
        for start in range(0, labels.shape[1], LOGIT_CHUNK):
            stop = min(start + LOGIT_CHUNK, labels.shape[1])
            logits = model.lm_head(hidden[:, start:stop]).float()
            out[:, start:stop] = F.cross_entropy(
                logits.flatten(0, 1), labels[:, start:stop].flatten(), ignore_index=IGNORE_INDEX, reduction="none"
            ).view(labels.shape[0], stop - start)
    return out


@torch.no_grad()
def position_losses(
    model,
    store: TokenStore,
    seq_len: int,
    *,
    rows: int,
    batch_size: int = 8,
    packing: str = "concat",
    device: torch.device | str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    progress=None,
) -> PositionLoss:
    """Loss per position over the first ``rows`` rows of ``seq_len`` inputs of ``store``."""
    seq_len, rows, batch_size = _positive_int("seq_len", seq_len), _positive_int("rows", rows), _positive_int("batch_size", batch_size)
    if packing not in PACKING:
        raise ValueError(f"packing must be one of {PACKING}, got {packing!r}")
    device = torch.device(device)
    result = PositionLoss.zeros(seq_len)
    loss_sum = torch.zeros(seq_len, dtype=torch.float64, device=device)
    count = torch.zeros(seq_len, dtype=torch.int64, device=device)
    for batch in eval_batches(store, seq_len, batch_size, packing=packing, max_rows=rows):
        if packing == "documents":
            input_ids, labels, cu_seqlens = (t.to(device) for t in batch.packed())
            positions = _segment_positions(cu_seqlens, input_ids.shape[1])
        else:
            input_ids, labels, cu_seqlens = batch.input_ids.to(device), batch.labels.to(device), None
            positions = torch.arange(seq_len, device=device).repeat(input_ids.shape[0])
        losses = token_losses(model, input_ids, labels, cu_seqlens=cu_seqlens, autocast_dtype=autocast_dtype).flatten()
        if not torch.isfinite(losses).all():
            raise FloatingPointError(f"non-finite token loss at context {seq_len} (rows {batch.rows[0].item()}..{batch.rows[-1].item()})")
        scored = labels.flatten() != IGNORE_INDEX
        loss_sum.index_add_(0, positions[scored], losses[scored].double())
        count.index_add_(0, positions[scored], torch.ones_like(positions[scored]))
        if progress is not None:
            progress.update(int(scored.sum()))
    result.loss_sum[:] = loss_sum.cpu().numpy()
    result.count[:] = count.cpu().numpy()
    return result


def default_seq_lens(train_seq_len: int) -> list[int]:
    """1×, 2× and 4× the training context."""
    return [train_seq_len, 2 * train_seq_len, 4 * train_seq_len]


def _row_needs(seq_len: int) -> str:
    return f"a row of context {seq_len} needs {seq_len + 1} tokens ({seq_len} inputs and one more target)"


def _more_data(num_tokens: int) -> str:
    shorter = f" (at most {num_tokens - 1} here)" if num_tokens >= 2 else ""
    return f"pass a shorter --seq-len{shorter}, or more held-out data (a longer text, or a larger --val-fraction when it is split)"


def fit_default_seq_lens(train_seq_len: int, num_tokens: int, split: str = "held-out") -> tuple[list[int], list[int]]:
    """The default contexts (1×, 2×, 4× the training length) that fit a split of ``num_tokens``
    tokens, and those that do not. A context ``L`` fits when the split holds one row of it:
    ``L + 1`` tokens. Raises ``ValueError`` when not even the training length fits. ``split``
    names the split in the message."""
    train_seq_len = _positive_int("train_seq_len", train_seq_len)
    lengths = default_seq_lens(train_seq_len)
    fit = [length for length in lengths if num_tokens >= length + 1]
    if not fit:
        raise ValueError(f"the {split} split has {num_tokens} tokens, too few for the training length: {_row_needs(train_seq_len)}; {_more_data(num_tokens)}")
    return fit, [length for length in lengths if length not in fit]


def skipped_message(train_seq_len: int, skipped: list[int], num_tokens: int, split: str = "held-out") -> str:
    """One line: which default contexts are left out and why."""
    names = ", ".join(f"{length // train_seq_len}x = {length}" for length in skipped)
    return f"skipping {names}: the {split} split has {num_tokens} tokens and {_row_needs(min(skipped))}"


def check_seq_lens_fit(seq_lens: list[int], num_tokens: int, split: str = "held-out") -> None:
    """Raise ``ValueError`` naming every context in ``seq_lens`` that has not one row in the split."""
    too_long = [length for length in seq_lens if num_tokens < length + 1]
    if too_long:
        names = ", ".join(map(str, too_long))
        raise ValueError(
            f"context length{'s' if len(too_long) > 1 else ''} {names} (--seq-len) do{'' if len(too_long) > 1 else 'es'} not fit the "
            f"{split} split: it has {num_tokens} tokens and {_row_needs(min(too_long))}; {_more_data(num_tokens)}"
        )


def _check_split(split) -> None:
    if split is not None and split not in EVAL_SPLITS:
        raise ValueError(f"split must be one of {EVAL_SPLITS}, or None for test (val when test is empty), got {split!r}")


def choose_split(corpus, split: str | None = None, warn: Callable[[str], object] | None = None) -> str:
    """The split to score: ``split`` (``"test"`` or ``"val"``), or by default ``"test"``, and
    ``"val"`` when the corpus's test split is empty (``warn`` is told why). An explicit
    ``"test"`` on an empty test split raises ``ValueError``."""
    _check_split(split)
    if corpus.test.num_tokens:
        return split or "test"
    if split == "test":
        raise ValueError(
            f"the test split of {corpus.path} is empty: no document of this small source hashed into it (val_fraction / 2 of "
            "the documents go there); pass --split val to score the validation split, or use more text or a larger --val-fraction"
        )
    if split is None and warn is not None:
        warn(f"warning: the test split of {corpus.path} is empty (too few documents); scoring val instead, the split learning rates are chosen on")
    return "val"


def default_out(model_dir: str | os.PathLike) -> Path:
    """``out/eval/<run name>.json``: the run folder's name (the model folder's own when it is not a run's ``model/``)."""
    from srope.lab.cli_args import OUT  # the project's git-ignored output folder

    folder = Path(model_dir).resolve()
    name = folder.parent.name if folder.name == "model" and folder.parent.name else folder.name
    return Path(OUT) / "eval" / f"{name}.json"


def rows_per_context(num_tokens: int, seq_lens: list[int], max_rows: int | None) -> tuple[int, dict[int, int]]:
    """The shared target budget ``N`` (a multiple of the longest context) and the rows of each context.

    A context ``L`` that does not divide ``N`` gets ``N // L`` rows (at most ``L - 1`` targets fewer).
    """
    longest = max(seq_lens)
    available = max(0, (num_tokens - 1) // longest)
    if available == 0:
        raise ValueError(f"the held-out split has {num_tokens} tokens, fewer than one row of the longest context {longest} (+1); use a shorter --seq-len or more held-out data")
    budget_rows = available if max_rows is None else min(available, _positive_int("max_rows", max_rows))
    budget = budget_rows * longest
    return budget, {length: budget // length for length in seq_lens}


def _ppl(loss: float | None) -> float | None:
    if loss is None:
        return None
    return math.exp(loss) if loss < 709 else math.inf


def evaluate_contexts(
    model,
    store: TokenStore,
    seq_lens: list[int],
    *,
    train_seq_len: int | None = None,
    batch_size: int = 8,
    max_rows: int | None = None,
    packing: str = "concat",
    bucket_size: int | None = None,
    device: torch.device | str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    show_progress: bool = False,
) -> dict:
    """Perplexity, within/beyond the training length and the per-position curve, per context length."""
    if not isinstance(seq_lens, (list, tuple)) or not seq_lens:
        raise ValueError(f"seq_lens must be a non-empty list of context lengths, got {seq_lens!r}")
    seq_lens = sorted({_positive_int("seq_len", length) for length in seq_lens})
    if train_seq_len is not None:
        train_seq_len = _positive_int("train_seq_len", train_seq_len)
    bucket_size = _positive_int("bucket_size", bucket_size) if bucket_size is not None else max(1, max(seq_lens) // 64)
    budget, rows = rows_per_context(store.num_tokens, seq_lens, max_rows)
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(rows[length] * length for length in seq_lens), unit="tok", unit_scale=True, dynamic_ncols=True)
    contexts = []
    try:
        for length in seq_lens:
            began = time.perf_counter()
            curve = position_losses(model, store, length, rows=rows[length], batch_size=batch_size, packing=packing, device=device, autocast_dtype=autocast_dtype, progress=bar)
            loss = curve.mean()
            entry = {"seq_len": length, "rows": rows[length], "targets": curve.targets, "loss": loss, "ppl": _ppl(loss)}
            if train_seq_len is not None:
                within, beyond = curve.mean(0, train_seq_len), curve.mean(train_seq_len)
                entry |= {"loss_within_train_len": within, "ppl_within_train_len": _ppl(within), "loss_beyond_train_len": beyond, "ppl_beyond_train_len": _ppl(beyond)}
            entry["positions"] = curve.buckets(bucket_size)
            entry["seconds"] = time.perf_counter() - began
            contexts.append(entry)
    finally:
        if bar is not None:
            bar.close()
    return {"train_seq_len": train_seq_len, "packing": packing, "target_budget": budget, "bucket_size": bucket_size, "contexts": contexts}


EVAL_PLOT = "srope eval's plot"


def plot_position_curves(result: dict, path: str | os.PathLike) -> None:
    """Mean loss per position bucket, one line per context length (PNG)."""
    from srope.lab import plotting

    figure = plotting.figure(EVAL_PLOT, figsize=(7.5, 4.5))
    axes = figure.add_subplot()
    for entry in result["contexts"]:
        buckets = entry["positions"]
        centres = [start + buckets["bucket_size"] / 2 for start in buckets["start"]]
        axes.plot(centres, buckets["loss"], marker=".", label=f"context {entry['seq_len']} (ppl {entry['ppl']:.2f})")
    if result.get("train_seq_len"):
        axes.axvline(result["train_seq_len"], color="grey", linestyle="--", linewidth=1, label=f"training length {result['train_seq_len']}")
    axes.set_xlabel("position in the context (" + ("row" if result.get("packing", "concat") == "concat" else "document segment") + ")")
    axes.set_ylabel(f"mean token loss (nats, buckets of {result['bucket_size']})")
    axes.set_title(str(result.get("title", "held-out loss by position")), fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(os.fspath(path), dpi=120)


def run_eval(
    model: str | os.PathLike,
    data: str | os.PathLike | None = None,
    *,
    out: str | os.PathLike | None = None,
    cache: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
    val_fraction: float | None = None,
    seq_lens: list[int] | None = None,
    batch_size: int = 8,
    max_rows: int | None = None,
    packing: str | None = None,
    bucket_size: int | None = None,
    split: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    plot: bool = True,
    show_progress: bool = False,
    log: Callable[[str], object] | None = None,
    warn: Callable[[str], object] | None = None,
) -> dict:
    """``srope eval``: load ``model`` (a model folder or a run folder), score a held-out split of
    ``data`` at ``seq_lens``, write ``out`` (JSON; default :func:`default_out`) and a PNG beside it.

    ``split``: ``"test"`` or ``"val"``; by default ``"test"``, or ``"val"`` when the store's test
    split is empty, told to ``warn`` (default: a line on stderr) because ``val`` is the split
    learning rates are chosen on (:func:`choose_split`). The result's ``data.split`` is the
    split scored.

    Defaults come from the run's ``train_config.json`` when present: ``data``, ``cache``,
    ``packing`` and the training length (``seq_lens``: 1×, 2×, 4× of it, those that fit the
    scored split; the others are listed in the result's ``seq_lens_skipped`` and told to
    ``log``). On the run's own data the run's tokenizer and ``val_fraction`` apply, so the
    held-out splits are the ones training held out; on other data the tokenizer saved with the
    model does. ``seq_lens`` given explicitly must all fit.
    """
    # AutoTokenizer on the model folder reads its config.json too: without model_type "srope"
    # registered it falls back to a bare config with a misleading warning about the model type.
    import srope.models  # noqa: F401
    from srope.lab.eval.model_dir import autocast_dtype as pick_autocast
    from srope.lab.eval.model_dir import find_train_config, has_tokenizer, load_model, read_model_config, resolve_device, resolve_model_dir
    from srope.lab.train.corpus import local_path
    from srope.lab.train.prepare import load_corpus
    from srope.lab.train.token_store import is_store
    from srope.lab.train.tokenizer import MISTRAL_V1

    model_dir = resolve_model_dir(model)
    config = read_model_config(model_dir)  # before anything reads it (AutoTokenizer does)
    out = Path(out) if out is not None else default_out(model_dir)
    if out.suffix != ".json":
        raise ValueError(f"out must be a .json file path, got {os.fspath(out)!r}")
    batch_size = _positive_int("batch_size", batch_size)
    if plot:
        from srope.lab import plotting

        plotting.require(EVAL_PLOT)  # before the scoring, not after
    if seq_lens is not None:
        if not isinstance(seq_lens, (list, tuple)) or not seq_lens:
            raise ValueError(f"seq_lens must be a non-empty list of context lengths, got {seq_lens!r}")
        seq_lens = sorted({_positive_int("seq_len", length) for length in seq_lens})
    train_config = find_train_config(model_dir) or {}
    train_seq_len = train_config.get("seq_len")
    if seq_lens is None and not train_seq_len:
        raise ValueError(f"no train_config.json beside {model_dir} to read the training length from: pass seq_lens (--seq-len L ...)")
    warn = warn if warn is not None else lambda line: print(line, file=sys.stderr)
    if data is None:
        if "data" not in train_config:
            raise ValueError(f"no train_config.json beside {model_dir} to read the training data from: pass data (--data SOURCE)")
        data = train_config["data"]
        if local_path(data) is not None and not Path(os.fspath(data)).expanduser().is_absolute():
            warn(
                f"warning: the run recorded --data {data!r} relative to the directory it ran in (before srope stored it absolute); "
                f"reading {local_path(data)} from here: pass --data to choose the file"
            )
    runs_data = "data" in train_config and _same_source(data, train_config["data"])
    if tokenizer is None and not is_store(data):  # a token store has its own (and refuses another)
        # The run's own data was tokenised with the run's tokenizer (its token store is in the
        # cache); other data is tokenised with the model's saved copy, so no network is needed.
        if runs_data or not has_tokenizer(model_dir):
            tokenizer = train_config.get("tokenizer") or MISTRAL_V1
        else:
            tokenizer = model_dir
    if val_fraction is None and runs_data and not is_store(data):
        val_fraction = train_config.get("val_fraction")  # the split training held out, not a new one
    cache = cache if cache is not None else train_config.get("cache")
    packing = packing or train_config.get("packing", "concat")
    if packing not in PACKING:
        raise ValueError(f"packing must be one of {PACKING}, got {packing!r}")
    _check_split(split)
    where = resolve_device(device)
    amp = pick_autocast(dtype, where)

    corpus = load_corpus(data, tokenizer, cache=cache, val_fraction=val_fraction)
    split = choose_split(corpus, split, warn)
    store = corpus.split(split)
    num_tokens = store.num_tokens
    skipped: list[int] = []
    if seq_lens is None:
        seq_lens, skipped = fit_default_seq_lens(int(train_seq_len), num_tokens, split)
        if skipped and log is not None:
            log(skipped_message(int(train_seq_len), skipped, num_tokens, split))
    else:
        check_seq_lens_fit(seq_lens, num_tokens, split)
    if corpus.vocab_size > config.get("vocab_size", 0):
        raise ValueError(f"the corpus's tokenizer has {corpus.vocab_size} tokens but the model's vocabulary is {config.get('vocab_size')}")
    if has_tokenizer(model_dir) and not _same_tokenizer(corpus, model_dir):
        raise ValueError(
            f"the corpus {corpus.path} was tokenised with {corpus.meta['tokenizer']['name']!r}, which is not the tokenizer saved "
            f"with the model in {model_dir}; pass the model's tokenizer (--tokenizer {model_dir}) or its training token store as --data"
        )
    net = load_model(model_dir, where)
    began = time.perf_counter()
    result = evaluate_contexts(
        net, store, list(seq_lens), train_seq_len=train_seq_len, batch_size=batch_size, max_rows=max_rows,
        packing=packing, bucket_size=bucket_size, device=where, autocast_dtype=amp, show_progress=show_progress,
    )  # fmt: skip
    result = {
        "model": os.fspath(model_dir),
        # what was read: the source's absolute path (with the store's hash of its files), the store and split
        "data": {"source": os.fspath(local_path(data) or data), "source_sha256": corpus.meta.get("source_sha256"), "store": os.fspath(corpus.path),
                 "split": split, "tokens": num_tokens, "documents": store.num_documents},  # fmt: skip
        "device": str(where),
        "autocast": None if amp is None else str(amp).replace("torch.", ""),
        "batch_size": batch_size,
        "max_rows": max_rows,
        "seq_lens_skipped": skipped,
        **result,
        "seconds": time.perf_counter() - began,
        "title": f"{model_dir.parent.name}/{model_dir.name} on {Path(os.fspath(data)).name} ({split})",
    }
    # the run's seed: the scoring itself draws nothing at random
    seeds = [train_config["seed"]] if "seed" in train_config else []
    result["provenance"] = provenance.record(seeds=seeds, device=str(where), wall_s=round(result["seconds"], 3))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    if plot:
        plot_position_curves(result, out.with_suffix(".png"))
    return result


def _same_source(a, b) -> bool:
    """Whether two ``--data`` values name the same source (equal, or the same existing path)."""
    if os.fspath(a) == os.fspath(b):
        return True
    first, second = Path(os.fspath(a)).expanduser(), Path(os.fspath(b)).expanduser()
    return first.exists() and second.exists() and first.resolve() == second.resolve()


def _same_tokenizer(corpus, model_dir: Path) -> bool:
    from srope.lab.train.tokenizer import load_tokenizer, tokenizer_fingerprint

    theirs = tokenizer_fingerprint(load_tokenizer(model_dir))
    if theirs == corpus.meta["tokenizer"]["fingerprint"]:
        return True
    # `srope train` saves the corpus's tokenizer with eos as the pad token (batched generation
    # needs one), which changes the fingerprint but no token id: compare it exported the same way.
    saved = corpus.path / "tokenizer"
    if not saved.is_dir():
        return False
    from srope.lab.train.export import generation_tokenizer

    return tokenizer_fingerprint(generation_tokenizer(saved)) == theirs


def format_table(result: dict) -> str:
    """A plain-text summary: one line per context length."""
    train = result.get("train_seq_len")
    lines = [f"{'context':>8} {'targets':>10} {'loss':>8} {'ppl':>10}" + (f" {'ppl<' + str(train):>12} {'ppl>=' + str(train):>12}" if train else "")]
    for entry in result["contexts"]:
        line = f"{entry['seq_len']:>8} {entry['targets']:>10} {entry['loss']:>8.4f} {entry['ppl']:>10.3f}"
        if train:
            beyond = entry.get("ppl_beyond_train_len")
            line += f" {entry['ppl_within_train_len']:>12.3f} " + (f"{beyond:>12.3f}" if beyond is not None else f"{'-':>12}")
        lines.append(line)
    return "\n".join(lines)
