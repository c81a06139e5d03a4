"""A tiny trained run (Selective RoPE GLA, training context 32) on an offline corpus, shared by the eval tests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from srope.lab.train.prepare import prepare_corpus
from tests.lab.train.conftest import make_text, sp_model, texts, tokenizer_dir  # noqa: F401  (fixtures)

TRAIN_SEQ_LEN = 32


@pytest.fixture(scope="session")
def eval_store(tmp_path_factory, tokenizer_dir) -> Path:  # noqa: F811
    """60 generated documents of 10-150 words (rows of 48 cross several), about a fifth held out."""
    rng = random.Random(2024)
    folder = tmp_path_factory.mktemp("eval_corpus")
    for i in range(60):
        (folder / f"doc{i:02d}.txt").write_text(make_text(rng, rng.randint(10, 150)), encoding="utf-8")
    return prepare_corpus(folder, tokenizer=str(tokenizer_dir), cache=tmp_path_factory.mktemp("eval_cache"), val_fraction=0.2)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, eval_store) -> Path:
    """A finished ``srope train`` run folder (train_config.json, metrics.jsonl, model/)."""
    from srope.lab.train.train_config import TrainConfig
    from srope.lab.train.trainer import train

    out = tmp_path_factory.mktemp("run")
    config = TrainConfig(
        preset="gla-tiny", position="selective_rope", data=str(eval_store), max_steps=12, lr=3e-3, seq_len=TRAIN_SEQ_LEN,
        global_batch_size=4, checkpoint_every=12, eval_rows=8, tensorboard=False, model={"hidden_size": 32, "num_heads": 2},
    )  # fmt: skip
    train(config, out)
    return out
