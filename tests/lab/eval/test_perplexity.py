"""``srope eval``: perplexity equals exp(mean token loss) of an independent plain loop on the
test split (``--split val`` on the validation split), the by-position curve agrees with it,
longer contexts than trained run and are reported, packed documents restart at every
document, bad arguments raise."""

from __future__ import annotations

import argparse
import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

import srope.models  # noqa: F401  (Auto registration)
from srope.lab import provenance
from srope.lab.eval.cli import add_eval_commands
from srope.lab.eval.perplexity import rows_per_context, run_eval
from srope.lab.train.token_store import open_store
from tests.lab.eval.conftest import TRAIN_SEQ_LEN


def _model(run):
    return AutoModelForCausalLM.from_pretrained(run / "model", dtype=torch.float32).eval()


def _loop_per_position(model, tokens: np.ndarray, seq_len: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Row by row, one sequence per forward, full logits: summed loss and count per position."""
    total, count = np.zeros(seq_len), np.zeros(seq_len, dtype=np.int64)
    for r in range(rows):
        ids = torch.from_numpy(tokens[r * seq_len : r * seq_len + seq_len + 1].astype(np.int64))
        with torch.no_grad():
            logits = model(ids[None, :-1], use_cache=False).logits[0].double()
        total += (-F.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]).numpy()
        count += 1
    return total, count


def _buckets(total: np.ndarray, count: np.ndarray, size: int) -> list[float]:
    return [total[s : s + size].sum() / count[s : s + size].sum() for s in range(0, len(total), size) if count[s : s + size].sum()]


def test_perplexity_is_exp_mean_loss_of_a_plain_loop_at_every_context(trained_run, eval_store, tmp_path):
    out = tmp_path / "eval.json"
    result = run_eval(trained_run / "model", out=out, batch_size=3, max_rows=5, bucket_size=8, device="cpu", dtype="float32")
    # Defaults come from the run: its data, its training length, 1x 2x 4x of it.
    assert result["train_seq_len"] == TRAIN_SEQ_LEN
    assert [c["seq_len"] for c in result["contexts"]] == [32, 64, 128]
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["provenance"]["commit"] == provenance.commit()[0] and result["provenance"]["seeds"] == [0]  # srope report reads it
    png = out.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    # The test split, not the validation split that training measured (and learning rates are chosen on).
    test = open_store(eval_store).test
    assert result["data"]["split"] == "test" and (result["data"]["tokens"], result["data"]["documents"]) == (test.num_tokens, test.num_documents)
    tokens = np.asarray(test.tokens)
    model = _model(trained_run)
    for entry in result["contexts"]:
        length = entry["seq_len"]
        assert entry["rows"] == 5 * 128 // length and entry["targets"] == 640  # the same targets at every context
        total, count = _loop_per_position(model, tokens, length, entry["rows"])
        expected = total.sum() / count.sum()
        assert math.isclose(entry["loss"], expected, rel_tol=1e-5)
        assert math.isclose(entry["ppl"], math.exp(expected), rel_tol=1e-5)
        # The curve: per-bucket means match the loop, and their weighted mean is the overall loss.
        curve = entry["positions"]
        assert curve["start"] == list(range(0, length, 8)) and sum(curve["targets"]) == entry["targets"]
        np.testing.assert_allclose(curve["loss"], _buckets(total, count, 8), rtol=1e-5)
        weighted = sum(l * n for l, n in zip(curve["loss"], curve["targets"], strict=True)) / sum(curve["targets"])
        assert math.isclose(weighted, entry["loss"], rel_tol=1e-9)
        # Within / beyond the training length split the same targets.
        within = total[:TRAIN_SEQ_LEN].sum() / count[:TRAIN_SEQ_LEN].sum()
        assert math.isclose(entry["loss_within_train_len"], within, rel_tol=1e-5)
        if length > TRAIN_SEQ_LEN:
            beyond = total[TRAIN_SEQ_LEN:].sum() / count[TRAIN_SEQ_LEN:].sum()
            assert math.isclose(entry["loss_beyond_train_len"], beyond, rel_tol=1e-5)
            assert math.isclose(entry["ppl_beyond_train_len"], math.exp(beyond), rel_tol=1e-5)
            n_within, n_beyond = count[:TRAIN_SEQ_LEN].sum(), count[TRAIN_SEQ_LEN:].sum()
            mix = (entry["loss_within_train_len"] * n_within + entry["loss_beyond_train_len"] * n_beyond) / (n_within + n_beyond)
            assert math.isclose(mix, entry["loss"], rel_tol=1e-9)
        else:
            assert entry["loss_beyond_train_len"] is None and entry["ppl_beyond_train_len"] is None


def test_documents_packing_restarts_at_every_document(trained_run, eval_store, tmp_path):
    length, rows = 48, 6  # 48 does not divide the store; rows hold several document boundaries
    result = run_eval(trained_run, eval_store, out=tmp_path / "docs.json", seq_lens=[length], max_rows=rows, batch_size=4, packing="documents", bucket_size=1, device="cpu", dtype="float32")
    store = open_store(eval_store).test
    tokens, starts = np.asarray(store.tokens).astype(np.int64), set(store.offsets.tolist())
    model = _model(trained_run)
    total, count = np.zeros(length), np.zeros(length, dtype=np.int64)
    boundaries = 0
    for r in range(rows):
        row = r * length
        cuts = [t for t in range(1, length) if row + t in starts]
        boundaries += len(cuts)
        for s, e in zip([0, *cuts], [*cuts, length], strict=True):
            ids = torch.from_numpy(tokens[row + s : row + e])
            with torch.no_grad():
                logp = F.log_softmax(model(ids[None], use_cache=False).logits[0].double(), -1)
            for t in range(e - s):
                target = row + s + t + 1
                if target in starts:  # the next document's first token is never a target
                    continue
                total[t] -= logp[t, tokens[target]].item()
                count[t] += 1
    assert boundaries >= 2, "the test rows must cross document boundaries"
    (entry,) = result["contexts"]
    assert entry["targets"] == count.sum()
    assert math.isclose(entry["loss"], total.sum() / count.sum(), rel_tol=1e-5)
    kept = count > 0
    np.testing.assert_allclose(entry["positions"]["loss"], total[kept] / count[kept], rtol=1e-5)
    assert entry["positions"]["start"] == np.flatnonzero(kept).tolist()


def test_eval_command_writes_json_png_and_a_table(trained_run, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="srope")
    add_eval_commands(parser.add_subparsers(dest="command"))
    out = tmp_path / "cli" / "result.json"
    args = parser.parse_args(["eval", "--model", str(trained_run), "--seq-len", "96", "32", "--max-rows", "2", "--device", "cpu", "--dtype", "float32", "--out", str(out)])
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert [c["seq_len"] for c in result["contexts"]] == [32, 96] and [c["targets"] for c in result["contexts"]] == [192, 192]
    assert out.with_suffix(".png").is_file()
    printed = capsys.readouterr().out
    assert "ppl>=32" in printed and f"{result['contexts'][1]['ppl']:.3f}" in printed


def test_split_val_scores_the_validation_split(trained_run, eval_store, tmp_path, capsys):
    corpus = open_store(eval_store)
    assert corpus.val.num_tokens and corpus.test.num_tokens and not np.array_equal(corpus.val.tokens[:65], corpus.test.tokens[:65])
    out = tmp_path / "val.json"
    parser = argparse.ArgumentParser(prog="srope")
    add_eval_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", "--model", str(trained_run), "--split", "val", "--seq-len", "32", "--max-rows", "2", "--device", "cpu", "--dtype", "float32", "--out", str(out)])
    assert args.func(args) == 0 and "warning" not in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["data"]["split"] == "val" and result["data"]["tokens"] == corpus.val.num_tokens and result["title"].endswith("(val)")
    total, count = _loop_per_position(_model(trained_run), np.asarray(corpus.val.tokens), 32, 2)
    assert math.isclose(result["contexts"][0]["loss"], total.sum() / count.sum(), rel_tol=1e-5)
    test = run_eval(trained_run, split="test", seq_lens=[32], max_rows=2, out=tmp_path / "test.json", plot=False, device="cpu", dtype="float32")
    assert test["data"]["split"] == "test" and not math.isclose(test["contexts"][0]["loss"], result["contexts"][0]["loss"], rel_tol=1e-6)
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--model", str(trained_run), "--split", "train"])
    with pytest.raises(ValueError, match=r"split must be one of \('test', 'val'\)"):
        run_eval(trained_run, split="train", out=tmp_path / "r.json", device="cpu")


def test_target_budget_is_shared():
    assert rows_per_context(1000, [32, 64, 128], None) == (7 * 128, {32: 28, 64: 14, 128: 7})
    assert rows_per_context(1000, [32, 96], 2) == (192, {32: 6, 96: 2})
    assert rows_per_context(129, [128], None) == (128, {128: 1})
    with pytest.raises(ValueError, match="fewer than one row of the longest context 128"):
        rows_per_context(128, [32, 128], None)


def test_bad_arguments_raise(trained_run, eval_store, tokenizer_dir, tmp_path):
    model = trained_run / "model"
    ok = dict(out=tmp_path / "r.json", device="cpu")
    with pytest.raises(ValueError, match=r"\.json"):
        run_eval(model, out=tmp_path / "r.txt")
    with pytest.raises(ValueError, match="not a model folder"):
        run_eval(tmp_path, **ok)
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        run_eval(model, seq_lens=[0], **ok)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        run_eval(model, seq_lens=[32.0], **ok)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        run_eval(model, batch_size=0, **ok)
    with pytest.raises(ValueError, match="dtype must be one of"):
        run_eval(model, dtype="float16", **ok)
    with pytest.raises(ValueError, match="device must be"):
        run_eval(model, device="tpu:x", out=tmp_path / "r.json")
    with pytest.raises(ValueError, match="packing must be one of"):
        run_eval(model, packing="ragged", **ok)
    with pytest.raises(ValueError, match=r"context length 1000000 \(--seq-len\) does not fit the test split"):
        run_eval(model, seq_lens=[10**6], **ok)
    # A bare model folder (no train_config.json) needs the lengths and the data spelled out.
    bare = tmp_path / "bare"
    shutil.copytree(model, bare)
    with pytest.raises(ValueError, match="--seq-len"):
        run_eval(bare, eval_store, **ok)
    with pytest.raises(ValueError, match="--data"):
        run_eval(bare, seq_lens=[32], **ok)
    assert run_eval(bare, eval_store, seq_lens=[32], max_rows=1, **ok)["train_seq_len"] is None
    # A model whose saved tokenizer is not the corpus's.
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    shutil.copytree(model, other, ignore=shutil.ignore_patterns("tokenizer*"))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(ValueError, match="not the tokenizer saved with the model"):
        run_eval(other, eval_store, seq_lens=[32], **ok)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("packing", ["concat", "documents"])
def test_cuda_matches_the_cpu(trained_run, eval_store, packing):
    """The CUDA path (our Triton rotation, fla's kernels, bf16 autocast by default) against the CPU float32 reference."""
    from srope.lab.eval.perplexity import evaluate_contexts

    store = open_store(eval_store).val
    model = _model(trained_run)
    kwargs = dict(train_seq_len=TRAIN_SEQ_LEN, max_rows=4, batch_size=3, packing=packing, bucket_size=16)
    cpu = evaluate_contexts(model, store, [32, 128], device="cpu", **kwargs)
    model.cuda()
    fp32 = evaluate_contexts(model, store, [32, 128], device="cuda", **kwargs)
    bf16 = evaluate_contexts(model, store, [32, 128], device="cuda", autocast_dtype=torch.bfloat16, **kwargs)
    for ref, a, b in zip(cpu["contexts"], fp32["contexts"], bf16["contexts"], strict=True):
        assert a["targets"] == b["targets"] == ref["targets"]
        assert math.isclose(a["loss"], ref["loss"], rel_tol=5e-3), (a["loss"], ref["loss"])  # fla: TF32 dot products
        assert math.isclose(b["loss"], ref["loss"], rel_tol=1e-2), (b["loss"], ref["loss"])
        np.testing.assert_allclose(a["positions"]["loss"], ref["positions"]["loss"], rtol=5e-3)


def test_eval_from_another_directory_scores_the_file_the_run_trained_on(tokenizer_dir, tmp_path, monkeypatch):
    """A run started with relative paths (--data corpus.txt --tokenizer tok --cache cache) and
    evaluated from another directory: it scored that directory's corpus.txt and recorded the
    same source. The run now records absolute paths, and eval records the file it read."""
    import random

    from srope.lab.cli import main
    from srope.lab.train.prepare import load_corpus
    from tests.lab.train.conftest import make_text

    rng = random.Random(11)
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    for folder in (here, elsewhere):
        folder.mkdir()
        (folder / "corpus.txt").write_text("\n\n".join(make_text(rng, 60).replace("\n\n", " ") for _ in range(40)), encoding="utf-8")
    shutil.copytree(tokenizer_dir, here / "tok")
    monkeypatch.chdir(here)
    argv = ["train", "--preset", "gla-tiny", "--data", "corpus.txt", "--tokenizer", "tok", "--cache", "cache", "--max-steps", "2", "--out", "run",
            "--val-fraction", "0.2", "--set", "seq_len=32", "--set", "global_batch_size=4", "--set", "tensorboard=false", "--set", "eval_rows=4",
            "--set", "model.hidden_size=32", "--set", "model.num_heads=2"]  # fmt: skip
    assert main(argv) == 0
    recorded = json.loads((here / "run" / "train_config.json").read_text())
    assert (recorded["data"], recorded["tokenizer"], recorded["cache"]) == (str(here / "corpus.txt"), str(here / "tok"), str(here / "cache"))
    monkeypatch.chdir(elsewhere)  # holds another corpus.txt (and no tok/ or cache/)
    result = run_eval(here / "run", out=elsewhere / "r.json", seq_lens=[32], device="cpu", dtype="float32", plot=False)
    trained = load_corpus(here / "corpus.txt", here / "tok", cache=here / "cache", val_fraction=0.2)
    assert result["data"]["source"] == str(here / "corpus.txt") and result["data"]["store"] == str(trained.path)
    assert result["data"]["source_sha256"] == trained.meta["source_sha256"]
    # A run recorded before paths were stored absolute: eval says which file it reads for the relative path.
    (here / "run" / "train_config.json").write_text(json.dumps({**recorded, "data": "corpus.txt", "tokenizer": str(here / "tok")}))
    warnings = []
    result = run_eval(here / "run", out=elsewhere / "r.json", seq_lens=[32], device="cpu", dtype="float32", plot=False, warn=warnings.append)
    assert result["data"]["source"] == str(elsewhere / "corpus.txt")
    assert any("relative" in line and str(elsewhere / "corpus.txt") in line for line in warnings), warnings
