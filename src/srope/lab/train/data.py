"""Language-model data: tokenised corpora on disk, fixed-length rows, a resumable sharded order.

Pipeline::

    TextSource -> documents -> token ids ([bos] + text + [eos] per document)
               -> token store (train / val / test, memory-mapped) -> rows -> Batch

**Token store** (:func:`prepare_corpus`, :func:`load_corpus`). Every non-empty document is
tokenised with special-token strings in its text read as plain text, wrapped in ``bos``/``eos``
(both on by default; the paper's data had ``bos`` only) and appended to its split's token
file; ``offsets`` holds the document starts. A store is a folder under
``<cache>/tokens/<source>/<tokenizer>-<hash>/``::

    meta.json                  how it was made (source, tokenizer, split rule, counts, sha256s)
    tokenizer/                 the tokenizer, saved with save_pretrained (save it with every model)
    train.tokens.bin           token ids, little-endian uint16 (uint32 if the vocabulary is larger)
    train.offsets.npy          int64 [documents + 1], document starts and the end
    val.tokens.bin, val.offsets.npy      the validation split: training measures it, learning rates are chosen on it
    test.tokens.bin, test.offsets.npy    the test split: `srope eval` reports it; nothing is chosen on it

It holds only relative paths, so a prepared cache can be copied to a machine without network
(``srope data prepare shakespeare --cache DIR``; there ``--cache DIR`` or ``SROPE_CACHE=DIR``).
Loading an existing store never touches the network; ``load_corpus`` also accepts the store
folder itself.

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
of ``seq_len + 1`` tokens at stride ``seq_len``: row ``r`` covers tokens ``[r·L, r·L + L]``,
its ``input_ids`` are the first ``L`` and its ``labels`` the last ``L``. ``labels`` are the
targets, already shifted (``labels[:, t]`` is the token after ``input_ids[:, t]``; do not
shift again). Every token after the first is a target exactly once per epoch. Packing:

* ``"concat"`` -- plain concatenation, the paper's setting: attention and targets run across
  document boundaries.
* ``"documents"`` -- the same rows, but a target that would be the first token of another
  document is ``IGNORE_INDEX``, and ``Batch.packed()`` flattens a batch to ``[1, B·L]`` with
  ``cu_seqlens`` at every document start and every row start, for the models' varlen path.

**Order** (:class:`PackedBatches`): epoch ``e`` visits the rows in the order of a PCG64
permutation seeded by ``(seed, e)`` (or in order when ``shuffle=False``); global step ``s`` is
the ``i``-th block of ``global_batch_size`` rows of epoch ``e``, with ``e, i = divmod(s,
steps_per_epoch)``; the rows left over at the end of an epoch are skipped in that epoch.
Rank ``r`` of ``W`` takes block ``r`` of ``W`` equal blocks of each global batch, so the
global batch is the same for every ``W`` that divides it. The state is ``{epoch, position,
seed, ...}``; a loader that loads it yields exactly the batches that follow.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from srope.lab.train.corpus import SHAKESPEARE_TEST, SHAKESPEARE_VALIDATION, TextSource, _publish, _write_json, cache_dir, local_files, local_path, read_json, resolve_source
from srope.lab.train.tokenizer import MISTRAL_V1, encode, load_tokenizer, tokenizer_fingerprint

IGNORE_INDEX = -100
PACKING = ("concat", "documents")
STORE_FORMAT = "srope-token-store"
STORE_VERSION = 2
SPLITS = ("train", "val", "test")
DEFAULT_VAL_FRACTION = 0.01
_ENCODE_BATCH_CHARS = 4_000_000


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_packing(packing: str) -> str:
    if packing not in PACKING:
        raise ValueError(f"packing must be one of {PACKING}, got {packing!r}")
    return packing


# --------------------------------------------------------------------------- token store


@dataclass(frozen=True)
class TokenStore:
    """One split: ``tokens`` (1-D unsigned ints) and ``offsets`` (int64 ``[documents + 1]``)."""

    tokens: np.ndarray
    offsets: np.ndarray
    fingerprint: str

    @classmethod
    def from_documents(cls, documents: list[list[int]], dtype=np.uint16) -> TokenStore:
        """An in-memory store of already tokenised documents (for tests and small experiments)."""
        lengths = [len(d) for d in documents]
        if not documents or min(lengths) == 0:
            raise ValueError("documents must be a non-empty list of non-empty token lists")
        tokens = np.concatenate([np.asarray(d, dtype=dtype) for d in documents])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        digest = hashlib.sha256(tokens.astype(np.dtype(dtype).newbyteorder("<")).tobytes()).hexdigest()
        return cls(tokens, offsets, digest)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_documents(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def document(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]

    def document_ids(self, positions: np.ndarray) -> np.ndarray:
        """The index of the document each stream position belongs to."""
        return np.searchsorted(self.offsets, positions, side="right") - 1


@dataclass
class Corpus:
    """A prepared corpus: its folder, metadata and the train / val / test :class:`TokenStore` s.

    ``val`` is the split training measures and learning rates are chosen on; ``test`` is the
    one to report (it may be empty for a very small source, see the module docstring).
    """

    path: Path
    meta: dict
    train: TokenStore
    val: TokenStore
    test: TokenStore

    def tokenizer(self):
        """The tokenizer the corpus was made with (from the store folder; no network)."""
        return load_tokenizer(self.path / "tokenizer")

    @property
    def vocab_size(self) -> int:
        return int(self.meta["tokenizer"]["vocab_size"])

    @property
    def bos_id(self) -> int | None:
        return self.meta["tokenizer"]["bos_id"]

    @property
    def eos_id(self) -> int | None:
        return self.meta["tokenizer"]["eos_id"]

    def split(self, name: str) -> TokenStore:
        """The :class:`TokenStore` of split ``"train"``, ``"val"`` or ``"test"``."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        return getattr(self, name)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:60] or "data"


def is_store(source) -> bool:
    """Whether ``source`` (a ``--data`` value or a path) is a token-store folder: one with a
    ``meta.json`` that names the store format, or with ``meta.json`` beside token files (a store
    whose metadata is damaged: :func:`open_store` says so rather than reading it as text).
    ``shakespeare`` and ``hf:NAME`` never are."""
    path = local_path(source) if isinstance(source, (str, os.PathLike)) else None
    if path is None:
        return False
    meta = path / "meta.json"
    if not meta.is_file():
        return False
    if any(path.glob("*.tokens.bin")):
        return True
    try:
        return json.loads(meta.read_text(encoding="utf-8")).get("format") == STORE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def check_store_options(store, *, tokenizer=None, val_fraction=None, max_train_tokens=None, max_val_tokens=None, add_bos=True, add_eos=True,
                        split=None, text_field=None, revision=None) -> None:  # fmt: skip
    """A token store's source was read, tokenised, split and capped when it was prepared: passing
    the options that make one with a store is a ValueError (they would do nothing, yet be recorded as used)."""
    given = {"tokenizer": tokenizer is not None, "val_fraction": val_fraction is not None, "max_train_tokens": max_train_tokens is not None,
             "max_val_tokens": max_val_tokens is not None, "add_bos": not add_bos, "add_eos": not add_eos,
             "split": split is not None, "text_field": text_field is not None, "revision": revision is not None}  # fmt: skip
    for name, used in given.items():
        if used:
            flag = {"add_bos": "--no-bos", "add_eos": "--no-eos"}.get(name, "--" + name.replace("_", "-"))
            raise ValueError(
                f"{os.fspath(store)} is a token store: its source, tokenizer, held-out split and limits were fixed when it was prepared; "
                f"leave {name} unset ({flag}), or pass the source text to prepare another store"
            )


_META_DAMAGED = "the metadata `srope data prepare` writes; the store is damaged, prepare it again"


def _check_meta(meta: dict, file: Path) -> None:
    """The fields of ``meta.json`` a store is opened and used with, each of its type; else a
    ValueError naming the file and the first one that is missing or wrong."""

    def field(path: str, ok, expected: str):
        value = meta
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                raise ValueError(f"{file} has no {path!r}; expected {_META_DAMAGED}")
            value = value[key]
        if not ok(value):
            raise ValueError(f"{file}: {path} is {value!r}, expected {expected}; {_META_DAMAGED}")

    count = lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0  # noqa: E731
    token_id = lambda value: value is None or count(value)  # noqa: E731
    field("dtype", lambda value: value in ("uint16", "uint32"), "'uint16' or 'uint32'")
    for split in SPLITS:
        field(f"splits.{split}.tokens", count, "a count of tokens")
        field(f"splits.{split}.documents", count, "a count of documents")
        field(f"splits.{split}.sha256", lambda value: isinstance(value, str), "a sha256 hex digest")
    field("tokenizer.name", lambda value: isinstance(value, str), "a name")
    field("tokenizer.fingerprint", lambda value: isinstance(value, str), "a fingerprint")
    field("tokenizer.vocab_size", lambda value: count(value) and value > 0, "a positive integer")
    field("tokenizer.bos_id", token_id, "a token id or null")
    field("tokenizer.eos_id", token_id, "a token id or null")


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


def _open_split(folder: Path, split: str, meta: dict) -> TokenStore:
    info = meta["splits"][split]
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    path = folder / f"{split}.tokens.bin"
    expected = info["tokens"] * dtype.itemsize
    if not path.is_file() or path.stat().st_size != expected:
        size = path.stat().st_size if path.is_file() else "missing"
        raise ValueError(f"{path}: expected {expected} bytes ({info['tokens']} tokens), found {size}; the store is incomplete, prepare it again")
    tokens = np.memmap(path, dtype=dtype, mode="r") if info["tokens"] else np.zeros(0, dtype=dtype)  # an empty file cannot be mapped
    offsets = np.load(folder / f"{split}.offsets.npy")
    if offsets.shape != (info["documents"] + 1,) or offsets[0] != 0 or offsets[-1] != info["tokens"]:
        raise ValueError(f"{folder / f'{split}.offsets.npy'}: does not match {info['documents']} documents of {info['tokens']} tokens")
    return TokenStore(tokens, offsets, info["sha256"])


def open_store(path: str | os.PathLike, *, verify: bool = False) -> Corpus:
    """Open a prepared token-store folder. ``verify`` re-hashes the token files against ``meta.json``."""
    folder = Path(path)
    if not is_store(folder):
        raise ValueError(f"{folder} is not a token store (no meta.json with format {STORE_FORMAT!r})")
    meta = read_json(folder / "meta.json", _META_DAMAGED)
    if meta.get("version") != STORE_VERSION:
        raise ValueError(f"{folder}: store version {meta.get('version')} is not {STORE_VERSION}; prepare it again")
    _check_meta(meta, folder / "meta.json")
    stores = {name: _open_split(folder, name, meta) for name in SPLITS}
    if verify:
        for name, store in stores.items():
            actual = hashlib.sha256(np.ascontiguousarray(store.tokens).tobytes()).hexdigest()
            if actual != store.fingerprint:
                raise ValueError(f"{folder}: {name} tokens hash to {actual}, meta.json says {store.fingerprint}")
    return Corpus(folder, meta, **stores)


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


# --------------------------------------------------------------------------- batches


def num_rows(num_tokens: int, seq_len: int) -> int:
    """Rows of ``seq_len`` inputs (+1 target) that fit in a stream of ``num_tokens`` tokens."""
    return max(0, (num_tokens - 1) // seq_len)


@dataclass
class Batch:
    """``B`` rows of ``L`` tokens.

    input_ids: int64 ``[B, L]``.
    labels: int64 ``[B, L]``, the target of each position (already shifted), ``IGNORE_INDEX`` where none.
    doc_start: bool ``[B, L]``, True where a document's first token sits.
    rows: int64 ``[B]``, the row indices in the split's stream.
    packing: ``"concat"`` or ``"documents"``.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    doc_start: torch.Tensor
    rows: torch.Tensor
    packing: str

    @property
    def num_targets(self) -> int:
        """Positions that carry a target; normalise a summed loss by the global total of this."""
        return int((self.labels != IGNORE_INDEX).sum())

    def to(self, device, non_blocking: bool = False) -> Batch:
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.input_ids), move(self.labels), move(self.doc_start), self.rows, self.packing)

    def split(self, micro_batch_size: int) -> list[Batch]:
        """Consecutive micro-batches of ``micro_batch_size`` rows (gradient accumulation)."""
        size = _check_int("micro_batch_size", micro_batch_size, 1)
        rows = self.input_ids.shape[0]
        if rows % size:
            raise ValueError(f"micro_batch_size {size} must divide the batch of {rows} rows")
        return [
            Batch(self.input_ids[i : i + size], self.labels[i : i + size], self.doc_start[i : i + size], self.rows[i : i + size], self.packing)
            for i in range(0, rows, size)
        ]

    def packed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids [1, B·L], labels [1, B·L], cu_seqlens int32 [N+1])`` for the varlen path.

        Segments start at every document start and every row start. Needs ``packing="documents"``
        (with ``"concat"`` a target may be the next document's first token).
        """
        if self.packing != "documents":
            raise ValueError("Batch.packed() needs a batch made with packing='documents'; with 'concat' labels cross documents")
        return flatten_packed(self.input_ids, self.labels, self.doc_start)


def flatten_packed(input_ids: torch.Tensor, labels: torch.Tensor, doc_start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten ``[B, L]`` rows into one packed sequence ``[1, B·L]`` with ``cu_seqlens`` (int32).

    ``labels`` must already be masked at document ends (``packing="documents"``).
    """
    for name, value in (("input_ids", input_ids), ("labels", labels), ("doc_start", doc_start)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor [B, L], got {getattr(value, 'shape', type(value).__name__)}")
    if labels.shape != input_ids.shape or doc_start.shape != input_ids.shape:
        raise ValueError(f"input_ids, labels and doc_start must share a shape [B, L], got {tuple(input_ids.shape)}, {tuple(labels.shape)}, {tuple(doc_start.shape)}")
    if doc_start.dtype != torch.bool:
        raise TypeError(f"doc_start must be a bool tensor, got {doc_start.dtype}")
    batch, length = input_ids.shape
    starts = doc_start.clone()
    starts[:, 0] = True
    positions = torch.nonzero(starts.reshape(-1)).squeeze(1)
    cu_seqlens = torch.cat([positions, positions.new_tensor([batch * length])]).to(torch.int32)
    return input_ids.reshape(1, -1), labels.reshape(1, -1), cu_seqlens


def make_batch(store: TokenStore, rows, seq_len: int, packing: str = "concat") -> Batch:
    """The :class:`Batch` of the given row indices of ``store`` (rows of ``seq_len`` inputs)."""
    seq_len = _check_int("seq_len", seq_len, 1)
    _check_packing(packing)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    available = num_rows(store.num_tokens, seq_len)
    if rows.size and (rows.min() < 0 or rows.max() >= available):
        raise ValueError(f"row indices must lie in [0, {available}) for {store.num_tokens} tokens and seq_len {seq_len}")
    window = np.empty((rows.size, seq_len + 1), dtype=np.int64)
    for i, row in enumerate(rows):
        window[i] = store.tokens[row * seq_len : row * seq_len + seq_len + 1]
    positions = rows[:, None] * seq_len + np.arange(seq_len + 1)
    index = np.minimum(np.searchsorted(store.offsets, positions), store.offsets.shape[0] - 1)
    is_start = store.offsets[index] == positions
    labels = window[:, 1:].copy()
    if packing == "documents":
        labels[is_start[:, 1:]] = IGNORE_INDEX
    return Batch(
        input_ids=torch.from_numpy(np.ascontiguousarray(window[:, :-1])),
        labels=torch.from_numpy(labels),
        doc_start=torch.from_numpy(np.ascontiguousarray(is_start[:, :-1])),
        rows=torch.from_numpy(rows.copy()),
        packing=packing,
    )


class PackedBatches:
    """Training batches in a deterministic, resumable order, sharded over data-parallel ranks.

    Iterating yields this rank's share (``global_batch_size / world_size`` rows) of global step
    0, 1, 2, ... without end (epochs roll over; the trainer stops at its ``max_steps``).
    ``batch(step)`` gives any step directly. See the module docstring for the order.
    """

    def __init__(
        self,
        store: TokenStore,
        seq_len: int,
        global_batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        packing: str = "concat",
    ):
        self.store = store
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.global_batch_size = _check_int("global_batch_size", global_batch_size, 1)
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        self.seed = _check_int("seed", seed, 0)
        self.shuffle = bool(shuffle)
        self.packing = _check_packing(packing)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        if self.global_batch_size % self.world_size:
            raise ValueError(f"global_batch_size {self.global_batch_size} must be a multiple of world_size {self.world_size}")
        self.rows_per_epoch = num_rows(store.num_tokens, self.seq_len)
        self.steps_per_epoch = self.rows_per_epoch // self.global_batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"the split has {store.num_tokens} tokens = {self.rows_per_epoch} rows of {self.seq_len}, "
                f"fewer than one global batch of {self.global_batch_size} rows"
            )
        self.step = 0
        self._order: tuple[int, np.ndarray] | None = None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            if self.shuffle:
                order = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.rows_per_epoch)
            else:
                order = np.arange(self.rows_per_epoch)
            self._order = (epoch, order)
        return self._order[1]

    def global_rows(self, step: int) -> np.ndarray:
        """Row indices of global step ``step`` (all ranks)."""
        epoch, position = divmod(_check_int("step", step, 0), self.steps_per_epoch)
        size = self.global_batch_size
        return self._epoch_order(epoch)[position * size : (position + 1) * size]

    def batch(self, step: int) -> Batch:
        """This rank's share of global step ``step``."""
        local = self.global_batch_size // self.world_size
        rows = self.global_rows(step)[self.rank * local : (self.rank + 1) * local]
        return make_batch(self.store, rows, self.seq_len, self.packing)

    def __iter__(self) -> PackedBatches:
        return self

    def __next__(self) -> Batch:
        batch = self.batch(self.step)
        self.step += 1
        return batch

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch

    def state_dict(self) -> dict:
        """Where the next batch comes from, plus what must match on resume (JSON-able)."""
        return {
            "epoch": self.epoch,
            "position": self.step % self.steps_per_epoch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
            "rows_per_epoch": self.rows_per_epoch,
            "store": self.store.fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from any world size); the settings that fix the order must match."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        missing = {"epoch", "position"} - set(state)
        if missing:
            raise ValueError(f"state is missing {sorted(missing)}")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "seq_len", "global_batch_size", "rows_per_epoch", "store"):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"cannot resume: the state has {key}={state[key]!r} but this loader has {mine[key]!r}")
        epoch, position = _check_int("epoch", state["epoch"], 0), _check_int("position", state["position"], 0)
        if position >= self.steps_per_epoch:
            raise ValueError(f"position must be < steps_per_epoch={self.steps_per_epoch}, got {position}")
        self.step = epoch * self.steps_per_epoch + position


def eval_batches(
    store: TokenStore,
    seq_len: int,
    batch_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    packing: str = "concat",
    max_rows: int | None = None,
) -> Iterator[Batch]:
    """Held-out batches, in order: rows ``0..n-1`` (at most ``max_rows``), rank ``r`` taking rows ``r, r+W, ...``.

    ``n`` is rounded down to a multiple of ``world_size``, so every rank gets the same number
    of batches of the same sizes (the last may be short); at most ``W-1`` rows and the final
    partial row are left out. ``seq_len`` may exceed the training length (extrapolation).
    """
    seq_len = _check_int("seq_len", seq_len, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    world_size = _check_int("world_size", world_size, 1)
    rank = _check_int("rank", rank, 0)
    _check_packing(packing)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    total = num_rows(store.num_tokens, seq_len)
    if max_rows is not None:
        total = min(total, _check_int("max_rows", max_rows, 1))
    per_rank = total // world_size
    if per_rank == 0:
        raise ValueError(f"{store.num_tokens} tokens give {total} rows of {seq_len}, fewer than world_size {world_size}")
    rows = np.arange(per_rank * world_size).reshape(per_rank, world_size)[:, rank]
    for start in range(0, per_rank, batch_size):
        yield make_batch(store, rows[start : start + batch_size], seq_len, packing)


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


__all__ = [
    "IGNORE_INDEX",
    "PACKING",
    "SPLITS",
    "Batch",
    "Corpus",
    "PackedBatches",
    "TokenStore",
    "eval_batches",
    "check_store_options",
    "flatten_packed",
    "is_store",
    "load_corpus",
    "make_batch",
    "num_rows",
    "open_store",
    "prepare_corpus",
    "run_prepare_command",
]
