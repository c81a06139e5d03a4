"""Language-model pre-training: data (sources, tokenizer, packing, order) and, later, the trainer."""

from srope.train.corpus import ChecksumError, Document, TextSource, cache_dir, prepare_shakespeare, resolve_source
from srope.train.data import (
    IGNORE_INDEX,
    Batch,
    Corpus,
    PackedBatches,
    TokenStore,
    eval_batches,
    flatten_packed,
    load_corpus,
    make_batch,
    open_store,
    prepare_corpus,
)
from srope.train.tokenizer import MISTRAL_V1, load_tokenizer, prepare_mistral_tokenizer, sentencepiece_to_hf

__all__ = [
    "IGNORE_INDEX",
    "MISTRAL_V1",
    "Batch",
    "ChecksumError",
    "Corpus",
    "Document",
    "PackedBatches",
    "TextSource",
    "TokenStore",
    "cache_dir",
    "eval_batches",
    "flatten_packed",
    "load_corpus",
    "load_tokenizer",
    "make_batch",
    "open_store",
    "prepare_corpus",
    "prepare_mistral_tokenizer",
    "prepare_shakespeare",
    "resolve_source",
    "sentencepiece_to_hf",
]
