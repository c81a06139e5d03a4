"""The token store: its on-disk format, opening it, and the options a prepared store refuses.

Pipeline::

    TextSource -> documents -> token ids ([bos] + text + [eos] per document)
               -> token store (train / val / test, memory-mapped) -> rows -> Batch

**Token store** (:func:`~srope.lab.train.prepare.prepare_corpus`, :func:`~srope.lab.train.prepare.load_corpus`). Every non-empty document is
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
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from srope.lab.train.corpus import local_path, read_json
from srope.lab.train.tokenizer import load_tokenizer

STORE_FORMAT = "srope-token-store"
STORE_VERSION = 2
SPLITS = ("train", "val", "test")


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
    one to report (it may be empty for a very small source, see :mod:`srope.lab.train.prepare`).
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


__all__ = ["SPLITS", "STORE_FORMAT", "STORE_VERSION", "Corpus", "TokenStore", "check_store_options", "is_store", "open_store"]
