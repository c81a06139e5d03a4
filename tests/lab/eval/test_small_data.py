"""``srope eval`` for a first-time user: the default contexts adapt to a small held-out split
(and say which were skipped), a source too small for a test split is scored on val with a
warning, ``--out`` has a default under ``out/``, and a split too small, a length too long or
a damaged model folder is an error that says what is wrong and where."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from srope.lab.eval.cli import add_eval_commands
from srope.lab.eval.perplexity import default_out, fit_default_seq_lens, run_eval, skipped_message
from srope.lab.train.prepare import load_corpus, prepare_corpus
from srope.lab.train.token_store import open_store
from tests.lab.eval.conftest import TRAIN_SEQ_LEN
from tests.lab.train.conftest import make_text

CPU = dict(device="cpu", dtype="float32")


def _notes(folder: Path, words: int) -> Path:
    """Four documents of ``words`` words (about 2 tokens each): the lowest-hash one is the val split, test is empty."""
    rng = random.Random(7)
    folder.mkdir()
    for i in range(4):
        (folder / f"note{i}.txt").write_text(make_text(rng, words), encoding="utf-8")
    return folder


def _val_tokens(data: Path, model_dir: Path, cache: Path) -> int:
    """Validation tokens of ``data`` as `srope eval` prepares it by default (with the model's tokenizer); its test split is empty."""
    corpus = load_corpus(data, model_dir, cache=cache)
    assert corpus.test.num_tokens == 0
    return corpus.val.num_tokens


def _eval_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="srope")
    add_eval_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", *argv])
    return args.func(args)


def test_fit_default_seq_lens():
    assert fit_default_seq_lens(32, 129) == ([32, 64, 128], [])
    assert fit_default_seq_lens(32, 128) == ([32, 64], [128])
    assert fit_default_seq_lens(32, 33) == ([32], [64, 128])
    assert skipped_message(256, [1024], 700) == "skipping 4x = 1024: the held-out split has 700 tokens and a row of context 1024 needs 1025 tokens (1024 inputs and one more target)"
    assert skipped_message(256, [1024], 700, "test").startswith("skipping 4x = 1024: the test split has 700 tokens")
    assert skipped_message(32, [64, 128], 50).startswith("skipping 2x = 64, 4x = 128: the held-out split has 50 tokens and a row of context 64 needs 65")
    with pytest.raises(ValueError, match=r"has 32 tokens, too few for the training length: a row of context 32 needs 33 tokens .* --seq-len \(at most 31 here\), or more held-out data"):
        fit_default_seq_lens(32, 32)


@pytest.mark.parametrize(("words", "expected", "skipped"), [(40, [32, 64], [128]), (20, [32], [64, 128])])
def test_defaults_fit_a_small_split_and_out_defaults_under_out_eval(trained_run, tmp_path, monkeypatch, capsys, words, expected, skipped):
    data, cache = _notes(tmp_path / "notes", words), tmp_path / "cache"
    tokens = _val_tokens(data, trained_run / "model", cache)
    assert max(expected) + 1 <= tokens < min(skipped) + 1, f"the notes are made to hold a row of {max(expected)} and none of {min(skipped)}, got {tokens} tokens"
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    # Not even --tokenizer: the notes are tokenised with the tokenizer saved with the model.
    assert _eval_command(["--model", str(trained_run), "--data", str(data), "--cache", str(cache), "--device", "cpu", "--dtype", "float32"]) == 0
    captured = capsys.readouterr()
    printed = captured.out.splitlines()
    # No test split in four documents: val is scored, with one line that says it is the split learning rates are chosen on.
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "test split" in warnings[0] and "scoring val instead, the split learning rates are chosen on" in warnings[0], captured.err

    out = Path("out") / "eval" / f"{trained_run.name}.json"
    result = json.loads((tmp_path / out).read_text())
    assert [c["seq_len"] for c in result["contexts"]] == expected and result["seq_lens_skipped"] == skipped
    assert result["data"]["split"] == "val" and result["data"]["tokens"] == tokens
    shared = (tokens - 1) // max(expected) * max(expected)
    assert [c["targets"] for c in result["contexts"]] == [shared] * len(expected)  # the same targets at every context
    names = ", ".join(f"{length // TRAIN_SEQ_LEN}x = {length}" for length in skipped)
    assert [line for line in printed if line.startswith("skipping")] == [
        f"skipping {names}: the val split has {tokens} tokens and a row of context {min(skipped)} needs {min(skipped) + 1} tokens "
        f"({min(skipped)} inputs and one more target)"
    ]
    assert printed[-1] == f"wrote {out} (results) and {out.with_suffix('.png')} (loss by position)"
    assert (tmp_path / out.with_suffix(".png")).read_bytes()[:4] == b"\x89PNG"


def test_a_split_too_small_for_the_training_length_says_how_many_tokens(trained_run, tmp_path):
    data, cache = _notes(tmp_path / "notes", 8), tmp_path / "cache"
    tokens = _val_tokens(data, trained_run / "model", cache)
    assert 2 <= tokens <= TRAIN_SEQ_LEN
    message = (
        rf"the val split has {tokens} tokens, too few for the training length: a row of context {TRAIN_SEQ_LEN} needs {TRAIN_SEQ_LEN + 1} tokens "
        rf".*--seq-len \(at most {tokens - 1} here\), or more held-out data"
    )
    with pytest.raises(ValueError, match=message):
        run_eval(trained_run, data, cache=cache, out=tmp_path / "r.json", **CPU)
    assert not (tmp_path / "r.json").exists()


def test_split_test_on_a_source_without_one_is_an_error(trained_run, tmp_path, capsys):
    """Asked for explicitly, an empty test split is an error (one line from the command); --split val
    scores val without the warning that the default's fallback gives."""
    from srope.lab.cli import main

    data, cache = _notes(tmp_path / "notes", 40), tmp_path / "cache"
    tokens = _val_tokens(data, trained_run / "model", cache)
    with pytest.raises(ValueError, match=r"the test split of .* is empty: .*pass --split val"):
        run_eval(trained_run, data, cache=cache, split="test", seq_lens=[32], out=tmp_path / "r.json", **CPU)
    assert not (tmp_path / "r.json").exists()
    argv = ["eval", "--model", str(trained_run), "--data", str(data), "--cache", str(cache), "--split", "test", "--seq-len", "32", "--device", "cpu", "--out", str(tmp_path / "r.json")]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("srope eval: error: the test split of ") and "--split val" in lines[0], lines
    warned: list[str] = []
    chosen = run_eval(trained_run, data, cache=cache, split="val", seq_lens=[32], out=tmp_path / "v.json", plot=False, warn=warned.append, **CPU)
    assert (chosen["data"]["split"], chosen["data"]["tokens"], warned) == ("val", tokens, [])
    default = run_eval(trained_run, data, cache=cache, seq_lens=[32], out=tmp_path / "d.json", plot=False, warn=warned.append, **CPU)
    assert default["data"]["split"] == "val" and default["contexts"] == [{**chosen["contexts"][0], "seconds": default["contexts"][0]["seconds"]}]
    assert len(warned) == 1 and warned[0].startswith("warning: the test split of ")


def test_explicit_lengths_that_do_not_fit_are_named(trained_run, eval_store, tmp_path):
    tokens = open_store(eval_store).test.num_tokens
    assert tokens < 5000
    with pytest.raises(ValueError, match=rf"context lengths 5000, 6000 \(--seq-len\) do not fit the test split: it has {tokens} tokens and a row of context 5000 needs 5001"):
        run_eval(trained_run, seq_lens=[32, 6000, 5000], out=tmp_path / "r.json", **CPU)
    # One token short of a row is too short; exactly one row is enough.
    with pytest.raises(ValueError, match=rf"context length {tokens} \(--seq-len\) does not fit"):
        run_eval(trained_run, seq_lens=[tokens], out=tmp_path / "r.json", **CPU)
    result = run_eval(trained_run, seq_lens=[tokens - 1], out=tmp_path / "r.json", plot=False, **CPU)
    assert result["contexts"][0]["rows"] == 1 and result["seq_lens_skipped"] == []


def test_default_out_is_named_after_the_run(trained_run, tmp_path):
    assert default_out(trained_run / "model") == Path("out", "eval", f"{trained_run.name}.json")
    bare = tmp_path / "my-model"
    bare.mkdir()
    assert default_out(bare) == Path("out", "eval", "my-model.json")


def test_the_runs_own_text_is_split_as_training_split_it(trained_run, tokenizer_dir, tmp_path):
    """A run trained on a text folder with --val-fraction and --tokenizer: by default eval holds
    out the same documents, from the same token store, not a split with the default fraction."""
    data, cache = _notes(tmp_path / "notes", 40), tmp_path / "cache"
    run = tmp_path / "run"
    shutil.copytree(trained_run / "model", run / "model")
    config = json.loads((trained_run / "train_config.json").read_text())
    (run / "train_config.json").write_text(json.dumps({**config, "data": str(data), "cache": str(cache), "val_fraction": 0.5, "tokenizer": str(tokenizer_dir)}))
    store = prepare_corpus(data, str(tokenizer_dir), cache=cache, val_fraction=0.5)
    assert store != prepare_corpus(data, str(tokenizer_dir), cache=cache)
    result = run_eval(run, seq_lens=[8], max_rows=2, out=tmp_path / "r.json", plot=False, **CPU)
    assert result["data"]["store"] == os.fspath(store)


@pytest.mark.parametrize("keep", [0, 5, 100, 0.5, -1])
def test_a_truncated_safetensors_file_is_named(trained_run, eval_store, tmp_path, keep):
    model = tmp_path / "model"
    shutil.copytree(trained_run / "model", model)
    weights = model / "model.safetensors"
    full = weights.read_bytes()
    weights.write_bytes(full[: int(len(full) * keep) if isinstance(keep, float) else keep if keep >= 0 else len(full) - 1])
    with pytest.raises(ValueError, match=re.escape(f"{weights} is not a readable safetensors file")) as caught:
        run_eval(model, eval_store, seq_lens=[32], out=tmp_path / "r.json", **CPU)
    assert "expected the complete weights" in str(caught.value)


def test_a_missing_or_damaged_model_folder_is_named(trained_run, eval_store, tmp_path):
    ok = dict(seq_lens=[32], out=tmp_path / "r.json", **CPU)
    with pytest.raises(FileNotFoundError, match=re.escape(f"model folder {os.fspath(tmp_path / 'nowhere')!r} does not exist")):
        run_eval(tmp_path / "nowhere", eval_store, **ok)
    model = tmp_path / "model"
    shutil.copytree(trained_run / "model", model)
    (model / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"no model weights in {model}: expected model.safetensors")):
        run_eval(model, eval_store, **ok)
    shutil.copy(trained_run / "model" / "model.safetensors", model)
    (model / "config.json").write_text('{"model_type": "srope",')
    with pytest.raises(ValueError, match=re.escape(f"{model / 'config.json'} is not valid JSON")):
        run_eval(model, eval_store, **ok)
    # A config.json that does not describe these weights is not loaded with random weights.
    config = json.loads((trained_run / "model" / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    with pytest.raises(ValueError, match=re.escape(f"the weights in {model / 'model.safetensors'} do not match {model / 'config.json'}: missing keys: model.layers.")):
        run_eval(model, eval_store, **ok)


def test_the_command_names_a_damaged_model_file_in_one_line(trained_run, eval_store, tmp_path, capsys):
    from srope.lab.cli import main

    model = tmp_path / "model"
    shutil.copytree(trained_run / "model", model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    argv = ["eval", "--model", str(model), "--data", str(eval_store), "--seq-len", "32", "--device", "cpu", "--out", str(tmp_path / "r.json")]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("srope eval: error: ") and str(weights) in lines[0], lines


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda config: {**config, "hidden_size": config["hidden_size"] * 2}, "do not match"),  # every shape differs
        (lambda config: {**config, "vocab_size": config["vocab_size"] + 8}, "do not match"),
        (lambda config: {**config, "model_type": "llama"}, "has model_type 'llama', not 'srope'"),
        (lambda config: {k: v for k, v in config.items() if k != "model_type"}, "has no model_type"),
    ],
    ids=["hidden-size", "vocab-size", "llama", "no-model-type"],
)
def test_a_config_that_disagrees_with_the_weights_or_is_another_librarys_is_one_line(trained_run, eval_store, tmp_path, capsys, change, expected):
    """A config.json whose shapes differ from the weights' (a RuntimeError traceback from
    transformers) or whose model_type is another library's (its model loaded, then failed)."""
    from srope.lab.cli import main

    model = tmp_path / "model"
    shutil.copytree(trained_run / "model", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(change(config)))
    argv = ["eval", "--model", str(model), "--data", str(eval_store), "--seq-len", "32", "--device", "cpu", "--out", str(tmp_path / "r.json")]
    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("srope eval: error: ") and expected in lines[0] and str(model / "config.json") in lines[0], lines
