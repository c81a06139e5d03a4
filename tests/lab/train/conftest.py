"""Offline corpus and tokenizer fixtures shared by the data and trainer tests."""

from __future__ import annotations

import io
import random
import socket
import subprocess
from pathlib import Path

import pytest

from srope.lab.train import corpus as corpus_mod
from srope.lab.train import tokenizer as tokenizer_mod
from srope.lab.train.tokenizer import sentencepiece_to_hf

WORDS = (
    "the king queen lord lady sword crown night day love death heart blood fair sweet good noble "
    "thou thee thy hath doth shall will come go speak hear see émigré naïve 中文 123 4567"
).split()


def make_text(rng: random.Random, words: int) -> str:
    out = []
    for _ in range(words):
        out.append(rng.choice(WORDS))
        out.append(rng.choice([" ", " ", " ", "  ", "\n", ", ", ".\n\n", "   ", " " * rng.randint(4, 12)]))
    return "".join(out)


@pytest.fixture(scope="session")
def texts() -> list[str]:
    """Documents of very different lengths (1 word to a few thousand tokens), plus an empty one and a duplicate."""
    rng = random.Random(1234)
    lengths = [1, 3, 700, 40, 1200, 5, 90, 2, 300, 60, 15, 500, 8, 250]
    docs = [make_text(rng, n) for n in lengths]
    docs.insert(4, "")  # dropped: no tokens
    docs.append(docs[2])  # an exact duplicate must land on the same side of the split
    return docs


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory, texts) -> Path:
    import sentencepiece as spm

    rng = random.Random(7)
    lines = [make_text(rng, rng.randint(1, 12)) for _ in range(3000)]
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buffer, vocab_size=400, model_type="bpe", byte_fallback=True,
        normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        character_coverage=1.0, minloglevel=2, num_threads=1,
    )  # fmt: skip
    # Like Mistral's model: whitespace-only pieces demoted to one lowest score, so sentencepiece
    # merges them last and breaks their ties leftmost (an id-ordered merge list gets this wrong).
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(buffer.getvalue())
    runs = [piece for piece in proto.pieces if len(piece.piece) > 1 and set(piece.piece) == {"▁"}]
    assert len(runs) >= 3
    for piece in runs:
        piece.score = -1e9
    path = tmp_path_factory.mktemp("sp") / "tiny.model"
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, sp_model) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    sentencepiece_to_hf(sp_model).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, texts) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for i, text in enumerate(texts):
        (folder / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    (folder / "notes.md").write_text("not data", encoding="utf-8")  # ignored: not a data suffix
    return folder


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test on any attempt to open a socket, run pip, or reach the hub."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(corpus_mod, "pip_download", refuse)
    monkeypatch.setattr(tokenizer_mod, "pip_download", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def store(tmp_path_factory, tokenizer_dir) -> str:
    """A prepared token store for training runs: 60 generated documents of 40-400 words; about a fifth held out."""
    from srope.lab.train.prepare import prepare_corpus

    rng = random.Random(99)
    folder = tmp_path_factory.mktemp("train_corpus")
    for i in range(60):
        (folder / f"doc{i:02d}.txt").write_text(make_text(rng, rng.randint(40, 400)), encoding="utf-8")
    path = prepare_corpus(folder, tokenizer=str(tokenizer_dir), cache=tmp_path_factory.mktemp("cache"), val_fraction=0.2)
    return str(path)
