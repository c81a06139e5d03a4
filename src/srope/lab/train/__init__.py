"""Language-model pre-training: data (sources, tokenizer, packing, order), the trainer, the
learning-rate sweep. Attributes import their module on first use (``srope --help`` stays fast)."""

from srope._lazy import lazy_exports

_EXPORTS = {
    **{name: "srope.lab.train.corpus" for name in ("ChecksumError", "Document", "TextSource", "cache_dir", "prepare_shakespeare", "resolve_source")},
    **{name: "srope.lab.train.token_store" for name in ("Corpus", "TokenStore", "open_store")},
    **{name: "srope.lab.train.prepare" for name in ("load_corpus", "prepare_corpus")},
    **{name: "srope.lab.train.batches" for name in ("IGNORE_INDEX", "Batch", "PackedBatches", "eval_batches", "flatten_packed", "make_batch")},
    **{name: "srope.lab.train.tokenizer" for name in ("MISTRAL_V1", "load_tokenizer", "prepare_mistral_tokenizer", "sentencepiece_to_hf")},
}  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = sorted(_EXPORTS)
