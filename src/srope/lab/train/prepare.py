"""Preparing a token store: reading a source, tokenising it, and holding out validation and test documents.

**Held-out splits**, by whole documents, deterministic. A perplexity reported on the split
that learning rates were chosen on is optimistic, so the held-out documents are divided into
``val`` (measured during training, used for selection) and ``test`` (what ``srope eval``
reports by default). For ``shakespeare`` they are fixed works:
:data:`srope.lab.train.corpus.SHAKESPEARE_VALIDATION` (both editions of Twelfth Night, and the
Sonnets) and :data:`srope.lab.train.corpus.SHAKESPEARE_TEST` (both editions of Hamlet and
Macbeth). For every other source a document is held out when the 64-bit BLAKE2b hash of its
UTF-8 text is below ``val_fraction · 2^64``, and goes to ``test`` when it is below
``val_fraction · 2^63``, else to ``val``: ``val_fraction`` is the held-out fraction, half
validation and half test. Identical texts always fall in the same split, and the split does
not depend on the order of the source. When no document falls in ``val`` (a small corpus,
e.g. one text file), the training document with the lowest hash goes there instead, so any
source of two or more documents has a training and a validation split; ``test`` may then be
empty (``srope eval`` falls back to ``val`` and says so).
``max_train_tokens`` stops reading after the document that fills the training split;
``max_val_tokens`` caps ``val`` and ``test`` each: held-out documents are dropped once their
split is full (they never move to training).

**Rows.** A split's token stream (documents concatenated in source order) is cut into rows
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from srope.lab.train.batches import _check_int
from srope.lab.train.corpus import SHAKESPEARE_TEST, SHAKESPEARE_VALIDATION, TextSource, _publish, _write_json, cache_dir, local_files, resolve_source
from srope.lab.train.token_store import SPLITS, STORE_FORMAT, STORE_VERSION, Corpus, check_store_options, is_store, open_store
from srope.lab.train.tokenizer import MISTRAL_V1, encode, load_tokenizer, tokenizer_fingerprint

DEFAULT_VAL_FRACTION = 0.01
_ENCODE_BATCH_CHARS = 4_000_000


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:60] or "data"


def _files_digest(path: Path) -> str:
    """sha256 over the relative names and contents of a local source's files."""
    digest = hashlib.sha256()
    root = path if path.is_dir() else path.parent
    for file in local_files(path):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=b"srope-heldout").digest(), "big")


def _hashed_split(value: int, val_fraction: float) -> str:
    """The split of a document whose text hashes to ``value``: the lower half of the held-out range is ``test``."""
    if value < val_fraction * 2.0**63:
        return "test"
    return "val" if value < val_fraction * 2.0**64 else "train"


class _SplitWriter:
    def __init__(self, folder: Path, split: str, dtype: np.dtype):
        self.path = folder / f"{split}.tokens.bin"
        self.offsets_path = folder / f"{split}.offsets.npy"
        self.handle = open(self.path, "wb")
        self.digest = hashlib.sha256()
        self.dtype = dtype
        self.offsets = [0]

    @property
    def num_tokens(self) -> int:
        return self.offsets[-1]

    def write(self, ids: list[int]) -> None:
        data = np.asarray(ids, dtype=np.int64)
        if data.min() < 0 or data.max() > np.iinfo(self.dtype).max:
            raise ValueError(f"token ids outside [0, {np.iinfo(self.dtype).max}] for dtype {self.dtype.name}")
        raw = data.astype(self.dtype).astype(self.dtype.newbyteorder("<")).tobytes()
        self.handle.write(raw)
        self.digest.update(raw)
        self.offsets.append(self.offsets[-1] + len(data))

    def close(self) -> dict:
        self.handle.close()
        offsets = np.asarray(self.offsets, dtype=np.int64)
        np.save(self.offsets_path, offsets)
        return {"tokens": self.num_tokens, "documents": len(self.offsets) - 1, "sha256": self.digest.hexdigest()}


def _plan(source: TextSource, tokenizer, tokenizer_name: str, *, val_fraction, max_train_tokens, max_val_tokens, add_bos, add_eos) -> dict:
    """Everything that determines a store's contents; its hash names the store folder."""
    if source.kind == "shakespeare":
        if val_fraction is not None:
            raise ValueError("the shakespeare held-out splits are fixed (whole works); leave val_fraction unset")
        split = {"rule": "works", "validation": list(SHAKESPEARE_VALIDATION), "test": list(SHAKESPEARE_TEST)}
    else:
        val_fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be a number in (0, 1), got {val_fraction!r}")
        split = {
            "rule": "blake2b-64 of the text < val_fraction * 2^63: test, < val_fraction * 2^64: val (else the lowest training one)",
            "val_fraction": float(val_fraction),
        }
    for name, value in (("max_train_tokens", max_train_tokens), ("max_val_tokens", max_val_tokens)):
        if value is not None:
            _check_int(name, value, 1)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if add_bos and bos is None:
        raise ValueError(f"tokenizer {tokenizer_name!r} has no bos token; pass add_bos=False")
    if add_eos and eos is None:
        raise ValueError(f"tokenizer {tokenizer_name!r} has no eos token; pass add_eos=False")
    return {
        "format": STORE_FORMAT,
        "version": STORE_VERSION,
        "source": source.describe(),
        "source_sha256": _files_digest(Path(source.path)) if source.kind == "files" else None,
        "tokenizer": {
            "name": tokenizer_name,
            "fingerprint": tokenizer_fingerprint(tokenizer),
            "vocab_size": len(tokenizer),
            "bos_id": bos,
            "eos_id": eos,
        },
        "add_bos": bool(add_bos),
        "add_eos": bool(add_eos),
        "split": split,
        "limits": {"max_train_tokens": max_train_tokens, "max_val_tokens": max_val_tokens},
        "dtype": "uint16" if len(tokenizer) <= 1 << 16 else "uint32",
    }


def _store_folder(root: Path, source: TextSource, plan: dict) -> Path:
    if source.kind == "shakespeare":
        source_key = "shakespeare"
    elif source.kind == "files":
        source_key = _slug(Path(source.path).resolve().name)
    else:
        source_key = _slug(source.path.replace("/", "--") + (f"--{source.config}" if source.config else ""))
    digest = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:12]
    return root / "tokens" / source_key / f"{_slug(plan['tokenizer']['name'])}-{digest}"


def _write_store(folder: Path, source: TextSource, tokenizer, plan: dict, cache, download: bool) -> dict:
    """Tokenise the source into the three splits. When no document of a source with two or more
    falls in the validation range (a small corpus), the training document with the lowest hash
    (and its duplicates) goes to ``val`` instead, in a second pass."""
    if source.kind == "shakespeare":
        works = {**dict.fromkeys(plan["split"]["validation"], "val"), **dict.fromkeys(plan["split"]["test"], "test")}
        counts = _write_splits(folder, source, tokenizer, plan, cache, download, lambda doc: works.get(doc.name, "train"))
        counts.pop("lowest_train_hash")
        _check_splits(source, plan, counts)
        return counts
    fraction = plan["split"]["val_fraction"]
    counts = _write_splits(folder, source, tokenizer, plan, cache, download, lambda doc: _hashed_split(_text_hash(doc.text), fraction))
    lowest = counts.pop("lowest_train_hash")
    if counts["splits"]["val"]["tokens"] == 0 and lowest is not None and counts["splits"]["train"]["documents"] >= 2:

        def with_lowest(doc) -> str:
            value = _text_hash(doc.text)
            return "val" if value == lowest else _hashed_split(value, fraction)

        counts = _write_splits(folder, source, tokenizer, plan, cache, download, with_lowest)
        counts.pop("lowest_train_hash")
        counts["held_out"] = "no document fell in the validation range of val_fraction: the training one with the lowest hash is held out for validation"
    _check_splits(source, plan, counts)
    return counts


def _check_splits(source: TextSource, plan: dict, counts: dict) -> None:
    """Training and validation need tokens; an empty test split is allowed (a very small source)."""
    for name, info in counts["splits"].items():
        if info["tokens"] == 0 and name != "test":
            what = Path(source.path).name if source.kind == "files" else source.path or source.kind
            raise ValueError(
                f"the {name} split of {what} is empty after reading {counts['documents_read']} documents "
                f"({counts['documents_empty']} without text): a held-out split needs at least two documents with text"
                + (" (a .txt file is split into documents at blank lines, about 2,000 characters each)" if source.kind == "files" else "")
            )


def _write_splits(folder: Path, source: TextSource, tokenizer, plan: dict, cache, download: bool, split_of) -> dict:
    """Write every document to the split ``split_of(document)`` names."""
    dtype = np.dtype(plan["dtype"])
    writers = {name: _SplitWriter(folder, name, dtype) for name in SPLITS}
    limits = plan["limits"]
    caps = {"train": limits["max_train_tokens"], "val": limits["max_val_tokens"], "test": limits["max_val_tokens"]}
    bos = [plan["tokenizer"]["bos_id"]] if plan["add_bos"] else []
    eos = [plan["tokenizer"]["eos_id"]] if plan["add_eos"] else []
    read = empty = 0
    lowest: int | None = None
    pending: list = []

    def flush() -> bool:
        """Tokenise and write the pending documents; return False once the training split is full."""
        nonlocal empty, lowest
        ids = encode(tokenizer, [doc.text for doc, _ in pending]) if pending else []
        for (doc, split), text_ids in zip(pending, ids):
            if not text_ids:
                empty += 1
                continue
            if split == "train" and source.kind != "shakespeare":
                value = _text_hash(doc.text)
                lowest = value if lowest is None else min(lowest, value)
            cap = caps[split]
            if cap is not None and writers[split].num_tokens >= cap:
                if split == "train":
                    return False
                continue
            writers[split].write(bos + text_ids + eos)
        pending.clear()
        return caps["train"] is None or writers["train"].num_tokens < caps["train"]

    chars = 0
    going = True
    for doc in source.documents(cache, download=download):
        read += 1
        pending.append((doc, split_of(doc)))
        chars += len(doc.text)
        if chars >= _ENCODE_BATCH_CHARS or len(pending) >= 1024:
            going, chars = flush(), 0
            if not going:
                break
    if going:
        flush()
    splits = {name: writer.close() for name, writer in writers.items()}
    return {"splits": splits, "documents_read": read, "documents_empty": empty, "lowest_train_hash": lowest}


def _resolve(source, tokenizer, cache, download, **options) -> tuple[Path, TextSource | None, object, dict | None]:
    if isinstance(source, (str, os.PathLike)) and is_store(Path(source)):
        check_store_options(source, tokenizer=tokenizer, **options)
        return Path(source), None, None, None
    source = resolve_source(source)
    tokenizer = MISTRAL_V1 if tokenizer is None else tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        name = MISTRAL_V1 if os.fspath(tokenizer) == MISTRAL_V1 else Path(tokenizer).name
        tokenizer = load_tokenizer(tokenizer, cache=cache, download=download)
    else:
        name = Path(getattr(tokenizer, "name_or_path", "") or "tokenizer").name
    plan = _plan(source, tokenizer, name, **options)
    return _store_folder(cache_dir(cache), source, plan), source, tokenizer, plan


def _build(folder: Path, source: TextSource, tokenizer, plan: dict, cache, download: bool) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".prepare-") as tmp:
        staging = Path(tmp) / "store"
        staging.mkdir()
        tokenizer.save_pretrained(staging / "tokenizer")
        counts = _write_store(staging, source, tokenizer, plan, cache, download)
        _write_json(staging / "meta.json", {**plan, **counts})
        _publish(staging, folder)
    return folder


def prepare_corpus(
    source: str | os.PathLike | TextSource = "shakespeare",
    tokenizer=None,
    *,
    cache: str | os.PathLike | None = None,
    val_fraction: float | None = None,
    max_train_tokens: int | None = None,
    max_val_tokens: int | None = None,
    add_bos: bool = True,
    add_eos: bool = True,
    download: bool = True,
) -> Path:
    """Tokenise ``source`` into a token store under the cache (once); return the store folder.

    ``source``: ``"shakespeare"``, a local file/folder, ``"hf:NAME[:CONFIG]"`` or a
    :class:`TextSource`. ``tokenizer``: ``"mistral-v1"`` (``None``: the default), a local HF
    tokenizer folder, or a tokenizer object. A token-store folder is returned as it is, and
    passing any option that makes a store with it raises (:func:`check_store_options`). ``val_fraction`` (default 0.01; not for ``shakespeare``) is the held-out
    fraction of the documents, half validation and half test; it and the token limits
    (``max_val_tokens`` caps ``val`` and ``test`` each) define the splits (module docstring).
    ``download=False`` forbids any network access: the tokenizer and the shakespeare texts
    must already be in the cache, and ``hf`` sources are refused.
    """
    options = dict(val_fraction=val_fraction, max_train_tokens=max_train_tokens, max_val_tokens=max_val_tokens, add_bos=add_bos, add_eos=add_eos)
    folder, source, tokenizer, plan = _resolve(source, tokenizer, cache, download, **options)
    if source is None or is_store(folder):
        return folder
    if not download and source.kind == "hf":
        others = sorted(p.name for p in folder.parent.glob("*") if is_store(p)) if folder.parent.is_dir() else []
        raise FileNotFoundError(
            f"no prepared token store at {folder} and download=False; run `srope data prepare` with the same "
            "arguments on a machine with network and copy the cache here"
            + (f" (stores made with other settings in {folder.parent}: {others}; pass one as the source to use it)" if others else "")
        )
    return _build(folder, source, tokenizer, plan, cache, download)


def load_corpus(
    source: str | os.PathLike | TextSource = "shakespeare",
    tokenizer=None,
    *,
    cache: str | os.PathLike | None = None,
    val_fraction: float | None = None,
    max_train_tokens: int | None = None,
    max_val_tokens: int | None = None,
    add_bos: bool = True,
    add_eos: bool = True,
    download: bool = True,
) -> Corpus:
    """The prepared :class:`Corpus` for these arguments, preparing it first if needed (see :func:`prepare_corpus`).

    ``source`` may also be a token-store folder (what ``srope data prepare`` printed), which is
    opened as is. An existing store is opened without any network access.
    """
    folder = prepare_corpus(
        source,
        tokenizer,
        cache=cache,
        val_fraction=val_fraction,
        max_train_tokens=max_train_tokens,
        max_val_tokens=max_val_tokens,
        add_bos=add_bos,
        add_eos=add_eos,
        download=download,
    )
    return open_store(folder)


# --------------------------------------------------------------------------- CLI


def run_prepare_command(args: argparse.Namespace) -> int:
    source, read = args.source, {"split": args.split, "text_field": args.text_field, "revision": args.revision}
    if is_store(Path(source)):
        check_store_options(source, **read)
    else:
        source = resolve_source(source, **read)
    corpus = load_corpus(
        source,
        args.tokenizer,
        cache=args.cache,
        val_fraction=args.val_fraction,
        max_train_tokens=args.max_train_tokens,
        max_val_tokens=args.max_val_tokens,
        add_bos=not args.no_bos,
        add_eos=not args.no_eos,
    )
    tok = corpus.meta["tokenizer"]
    print(f"token store: {corpus.path}")
    print(f"tokenizer:   {tok['name']} (vocab {tok['vocab_size']}, bos {tok['bos_id']}, eos {tok['eos_id']})")
    for name in SPLITS:
        store = corpus.split(name)
        print(f"{name:<5}        {store.num_tokens:,} tokens in {store.num_documents:,} documents")
    if not corpus.test.num_tokens:
        print("             (the test split is empty: no document of this small source hashed into it; srope eval scores val instead)")
    return 0


__all__ = ["load_corpus", "prepare_corpus", "run_prepare_command"]
