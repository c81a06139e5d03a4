"""The pre-training loop on the CPU: loss falls, exact resume, DDP/FSDP2 equal one process,
packed documents, the NaN guard, optimiser groups and the schedule."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import srope.models  # noqa: F401  (registers the Auto classes)
from srope.models import SRopeForCausalLM, preset_config
from srope.lab.train.optim import parameter_groups
from srope.lab.cli import main
from srope.lab.config import apply_overrides
from srope.lab.train.train_config import TrainConfig
from srope.lab.train.trainer import token_loss_sum, train
from tests.lab.train.conftest import make_text

SMALL = dict(preset="gla-tiny", seq_len=32, global_batch_size=4, checkpoint_every=2, eval_rows=8, tensorboard=False, model={"hidden_size": 32, "num_heads": 2})


def losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


def test_loss_falls_and_the_run_is_complete(store, tmp_path):
    config = TrainConfig(data=store, max_steps=16, lr=3e-3, **SMALL)
    final = train(config, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 17))
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s"} <= set(records[0])
    first, last = sum(r["loss"] for r in records[:3]) / 3, sum(r["loss"] for r in records[-3:]) / 3
    assert last < first - 0.5, (first, last)
    assert math.isclose(final["val_ppl"], math.exp(final["val_loss"]))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert isinstance(model, SRopeForCausalLM) and (tmp_path / "model" / "tokenizer.json").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000014", "step_00000016"]


def test_stop_and_resume_equals_one_uninterrupted_run(store, tmp_path):
    config = TrainConfig(data=store, max_steps=7, lr=3e-3, **SMALL)
    train(config, tmp_path / "whole")
    train(config, tmp_path / "split", stop_after=5)  # a planned stop writes step 5 (checkpoint_every is 2)
    assert not (tmp_path / "split" / "model").exists()
    with pytest.raises(FileExistsError):
        train(config, tmp_path / "split")
    train(config, tmp_path / "split", resume=True)
    assert losses(tmp_path / "split") == losses(tmp_path / "whole")  # bitwise
    whole, split = (load_file(tmp_path / run / "model" / "model.safetensors") for run in ("whole", "split"))
    assert whole.keys() == split.keys() and all(torch.equal(whole[k], split[k]) for k in whole)


def _torchrun(args: list[str], nproc: int, cwd: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "srope", "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("parallel, dtype", [("ddp", "float32"), ("fsdp", "float32"), ("fsdp", "bfloat16")])
def test_two_processes_equal_one(store, tmp_path, parallel, dtype):
    common = ["--preset", "gla-tiny", "--data", store, "--max-steps", "4", "--set", "seq_len=32", "--set", "global_batch_size=4",
              "--set", "lr=0.003", "--set", "tensorboard=false", "--set", "eval_rows=8", "--set", 'model={"hidden_size": 32, "num_heads": 2}',
              "--set", "micro_batch_size=1", "--set", f"parallel={parallel}", "--set", f"dtype={dtype}"]  # fmt: skip
    _torchrun(common + ["--out", str(tmp_path / "one")], 1, tmp_path)
    _torchrun(common + ["--out", str(tmp_path / "two")], 2, tmp_path)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert [s for s, _ in one] == [s for s, _ in two] == [1, 2, 3, 4]
    # bfloat16: FSDP2 gathers the weights in bfloat16 where one process keeps float32 under autocast
    loss_tol, weight_tol = (1e-5, 1e-4) if dtype == "float32" else (1e-2, 1e-2)
    for (_, a), (_, b) in zip(one, two):
        assert abs(a - b) <= loss_tol * abs(a), (one, two)
    w1, w2 = (load_file(tmp_path / run / "model" / "model.safetensors") for run in ("one", "two"))
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < weight_tol


def test_documents_packing_loss_is_per_document(store):
    from srope.lab.train.batches import PackedBatches
    from srope.lab.train.prepare import load_corpus

    corpus = load_corpus(store)
    loader = PackedBatches(corpus.train, 96, 2, packing="documents")
    batch = next(b for b in loader if len(b.packed()[2]) > 4)  # a batch with document boundaries inside its rows
    input_ids, labels, cu_seqlens = batch.packed()
    torch.manual_seed(0)
    model = SRopeForCausalLM(preset_config("gla-tiny", position="selective_rope", vocab_size=corpus.vocab_size, hidden_size=32, num_heads=2)).eval()
    total = token_loss_sum(model, batch, torch.device("cpu"), torch.autocast("cpu", enabled=False))
    separate = 0.0
    for s, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        logits = model(input_ids[:, s:e], use_cache=False).logits[0]
        separate += torch.nn.functional.cross_entropy(logits, labels[0, s:e], ignore_index=-100, reduction="sum")
    assert abs(total.item() - separate.item()) < 1e-4 * abs(separate.item())


def test_resume_refuses_changed_settings(store, tmp_path):
    config = TrainConfig(data=store, max_steps=4, lr=3e-3, **SMALL)
    train(config, tmp_path, stop_after=2)
    with pytest.raises(ValueError, match="settings differ"):
        train(dataclasses.replace(config, lr=1e-3), tmp_path, resume=True)
    train(dataclasses.replace(config, checkpoint_every=1), tmp_path, resume=True)  # bookkeeping may change


def test_grad_clip_zero_means_no_clipping(store, tmp_path):
    a = train(TrainConfig(data=store, max_steps=2, lr=3e-3, grad_clip=0, **SMALL), tmp_path / "off")
    b = train(TrainConfig(data=store, max_steps=2, lr=3e-3, grad_clip=1e30, **SMALL), tmp_path / "huge")
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
    with pytest.raises(ValueError, match="grad_clip must be >= 0"):
        TrainConfig(grad_clip=-1).resolved()


def test_nan_guard_stops_with_the_step(store, tmp_path):
    config = TrainConfig(data=store, max_steps=6, lr=1e12, warmup=0.0, lr_start=1e12, grad_clip=1e30, **SMALL)
    with pytest.raises(FloatingPointError, match=r"non-finite (loss|grad_norm) .* at step \d"):
        train(config, tmp_path)


def test_weight_decay_groups():
    config = preset_config("gdn-tiny", position={"type": "selective_rope", "bias": True, "learnable_temperature": True}, hidden_size=32, num_heads=2)
    model = SRopeForCausalLM(config)
    decay, keep = (set(group["names"]) for group in parameter_groups(model, 0.1))
    assert not decay & keep and decay | keep == {n for n, _ in model.named_parameters()}
    for name in keep:
        assert any(part in name for part in ("norm", "bias", "A_log", "dt_bias", "proj_gain", "learned_temperature")), name
    assert "model.layers.0.mixer.position.bias" in keep and "model.layers.0.mixer.position.proj_gain" in keep
    assert "model.layers.0.mixer.position.learned_temperature" in keep and "model.layers.0.mixer.A_log" in keep
    assert "model.layers.0.mixer.q_proj.weight" in decay and "model.embeddings.weight" in decay


def test_overrides_are_checked():
    config = apply_overrides(TrainConfig(), ["lr=0.002", "model.hidden_size=48", "position.gate=null", "packing=documents"])
    assert config.lr == 0.002 and config.model == {"hidden_size": 48} and config.position == {"type": "selective_rope", "gate": None}
    with pytest.raises(ValueError, match="unknown setting 'learning_rate'"):
        apply_overrides(TrainConfig(), ["learning_rate=1"])
    with pytest.raises(ValueError, match="unknown preset"):
        TrainConfig(preset="gpt5").resolved()


def test_a_plain_text_file_trains_end_to_end(tokenizer_dir, tmp_path, capsys, monkeypatch):
    """One .txt file is split into documents at blank lines, so it has a held-out split; the
    run says what it read and wrote, and its model loads with a tokenizer ready for batched
    generation (pad token, left padding)."""
    from transformers import AutoTokenizer

    from srope.lab.cli import main

    rng = random.Random(5)
    text = "\n\n".join(make_text(rng, 60).replace("\n\n", " ") for _ in range(40))
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--preset", "gla-tiny", "--data", "corpus.txt", "--tokenizer", str(tokenizer_dir), "--max-steps", "3", "--cache", "cache",
            "--set", "seq_len=32", "--set", "global_batch_size=4", "--set", "tensorboard=false", "--set", 'model={"hidden_size": 32, "num_heads": 2}']  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr()
    out = tmp_path / "out" / "train" / "gla-tiny-selective_rope"
    report = printed.err + printed.out
    for expected in (f"data   {tmp_path / 'corpus.txt'}: train ", " documents, val ", "model  gla-tiny, gla + selective_rope: ", f"out    {Path('out/train/gla-tiny-selective_rope')}",
                     "model  out/train/gla-tiny-selective_rope/model", "logs   out/train/gla-tiny-selective_rope/metrics.jsonl", "time   data ",
                     "test   ", "srope eval --model out/train/gla-tiny-selective_rope"):  # fmt: skip
        assert expected in report, report
    final = json.loads(printed.out.strip().splitlines()[-1])
    assert final["step"] == 3 and set(final["time_s"]) >= {"data", "model", "steps", "eval", "checkpoint", "export"}
    meta = json.loads(next((tmp_path / "cache" / "tokens").glob("*/*/meta.json")).read_text())
    assert meta["splits"]["val"]["documents"] >= 1 and meta["splits"]["train"]["documents"] >= 5  # ~2,000 characters each
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    assert tokenizer.pad_token == tokenizer.eos_token and tokenizer.padding_side == "left"
    assert "import srope.models" in (out / "model" / "README.md").read_text()  # how to load it, beside it
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] and run["metrics"]["step"] == 3 and run["provenance"]["command"]
    assert run["provenance"]["commit"] is None or len(run["provenance"]["commit"]) == 40
    assert run["provenance"]["seeds"] == [0] and run["provenance"]["wall_s"] > 0 and "torch" in run["provenance"]["versions"]
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert model.generation_config.pad_token_id == tokenizer.eos_token_id


def test_too_little_data_says_how_much_is_needed(store, tmp_path):
    config = TrainConfig(data=store, max_steps=2, **{**SMALL, "seq_len": 100000})
    with pytest.raises(ValueError, match=r"too little training data: [\d,]+ tokens .* needs 400,001 \(global_batch_size 4 x seq_len 100000 \+ 1\)"):
        train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_which_steps_run_as_a_cuda_graph():
    # The rule alone (capturing needs a GPU, checked on the H200 by the benchmarks):
    # torch.compile and DDP do not keep the step out of the graph; FSDP2 or per-document
    # packing (shapes that change from step to step) do.
    from srope.lab.train.distributed import World
    from srope.lab.train.preflight import use_cuda_graph as _use_cuda_graph

    gpu, cpu = World(device=torch.device("cuda", 0)), World()
    assert _use_cuda_graph(TrainConfig(), gpu)
    assert _use_cuda_graph(TrainConfig(compile=True), gpu)
    assert not _use_cuda_graph(TrainConfig(cuda_graph="off"), gpu)
    assert not _use_cuda_graph(TrainConfig(), cpu)
    assert not _use_cuda_graph(TrainConfig(packing="documents"), gpu)
    two = World(size=2, device=torch.device("cuda", 0))
    assert _use_cuda_graph(TrainConfig(parallel="ddp"), two)
    assert not _use_cuda_graph(TrainConfig(parallel="fsdp"), two)
    with pytest.raises(ValueError, match="FSDP2"):
        _use_cuda_graph(TrainConfig(cuda_graph="on", parallel="fsdp"), two)
    with pytest.raises(ValueError, match="packing='documents'"):
        _use_cuda_graph(TrainConfig(cuda_graph="on", packing="documents"), gpu)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpus_ddp_captured_equals_eager_and_one_gpu(store, tmp_path):
    """DDP's captured step (flat gradients, one all-reduce inside the CUDA graph) against
    DDP's eager step and one GPU's captured step: the same global batch, the same losses
    up to bf16 reduction order."""
    common = ["--preset", "gla-tiny", "--data", store, "--max-steps", "8", "--set", "seq_len=64", "--set", "global_batch_size=8",
              "--set", "lr=0.003", "--set", "tensorboard=false", "--set", "eval_rows=8", "--set", "micro_batch_size=2",
              "--position", "selective_rope"]  # fmt: skip
    env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    runs = {"one": (1, []), "captured": (2, []), "eager": (2, ["--set", "cuda_graph=off"])}
    for name, (nproc, extra) in runs.items():
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "srope", "train",
                   *common, *extra, "--out", str(tmp_path / name)]  # fmt: skip
        result = subprocess.run(command, cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        captured = "the step as a CUDA graph" in result.stdout and "without a CUDA graph" not in result.stdout
        assert captured == (name != "eager"), result.stdout[-2000:]
    one, captured, eager = (losses(tmp_path / name) for name in runs)
    assert [s for s, _ in captured] == list(range(1, 9))
    for (_, a), (_, b), (_, c) in zip(one, captured, eager):
        assert abs(a - b) <= 2e-3 * abs(a) and abs(b - c) <= 2e-3 * abs(b), (one, captured, eager)
    w_captured, w_eager = (load_file(tmp_path / name / "model" / "model.safetensors") for name in ("captured", "eager"))
    assert max((w_captured[k] - w_eager[k]).abs().max().item() for k in w_captured) < 1e-2


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(store, tmp_path):
    config = TrainConfig(data=store, max_steps=4, lr=3e-3, **SMALL)
    train(config, tmp_path / "whole")
    train(config, tmp_path / "split", stop_after=2)
    metrics = tmp_path / "split" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 3, "lo')  # killed while writing step 3's line
    with pytest.warns(UserWarning, match=re.escape(f"{metrics}: dropped a torn last line")):
        train(config, tmp_path / "split", resume=True)
    assert losses(tmp_path / "split") == losses(tmp_path / "whole")


def test_a_corrupt_metrics_line_is_an_error_naming_file_and_line(store, tmp_path):
    config = TrainConfig(data=store, max_steps=4, lr=3e-3, **SMALL)
    train(config, tmp_path, stop_after=2)
    metrics = tmp_path / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(["{garbage", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="^" + re.escape(f"{metrics}:1: not a JSON record")) as error:
        train(config, tmp_path, resume=True)
    assert "\n" not in str(error.value)


def test_stop_after_below_the_resumed_step_is_refused(store, tmp_path):
    config = TrainConfig(data=store, max_steps=6, lr=3e-3, **SMALL)
    train(config, tmp_path, stop_after=4)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir()), (tmp_path / "metrics.jsonl").read_text()
    for stop_after in (2, 4):
        with pytest.raises(ValueError, match=f"--stop-after {stop_after}: the run resumes at step 4"):
            train(config, tmp_path, resume=True, stop_after=stop_after)
    assert (sorted(p.name for p in (tmp_path / "checkpoints").iterdir()), (tmp_path / "metrics.jsonl").read_text()) == before


def test_a_token_store_run_refuses_tokenizer_and_val_fraction_and_records_none(store, tokenizer_dir, tmp_path, capsys, monkeypatch):
    """--tokenizer and --val-fraction did nothing with a token store but went into train_config.json."""
    from srope.lab.cli import main

    monkeypatch.chdir(tmp_path)
    for extra, option in ((["--tokenizer", "/no/such/tokenizer"], "--tokenizer"), (["--tokenizer", str(tokenizer_dir)], "--tokenizer"),
                          (["--val-fraction", "0.3"], "--val-fraction"), (["--set", "val_fraction=0.3"], "--val-fraction")):  # fmt: skip
        assert main(["train", "--preset", "gla-tiny", "--data", store, "--max-steps", "1", *extra]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "is a token store" in err[0] and option in err[0], err
    assert not (tmp_path / "out").exists()
    resolved = TrainConfig(data=store).resolved()
    assert resolved.tokenizer is None and resolved.val_fraction is None  # what is recorded: the store's own
    assert TrainConfig(data="shakespeare").resolved().tokenizer == "mistral-v1"


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("lr_start=-0.001", "lr_start must be >= 0"),  # trained by gradient ascent and exited 0
        ("lr_end=-0.0001", "lr_end must be >= 0"),
        ("lr=-0.001", "lr must be > 0"),
        ("lr=0", "lr must be > 0"),
        ("lr=nan", "lr must be > 0"),
        ("lr=inf", "lr must be > 0"),
        ("lr_start=0.5", "lr_start (0.5) must not exceed the peak lr"),
        ("weight_decay=-1", "weight_decay must be >= 0"),
        ("eval_every=-1", "eval_every must be an integer >= 0 (0: only at the end)"),
        ("global_batch_size=0", "global_batch_size must be a positive integer, got 0"),  # became the preset's value
        ("seq_len=0", "seq_len must be a positive integer, got 0"),
        ("beta1=1", "beta1 must be in [0, 1)"),
        ("beta2=-0.5", "beta2 must be in [0, 1)"),
        ("eps=0", "eps must be > 0"),
        ("grad_clip=nan", "grad_clip must be >= 0"),
        ("seed=-1", "seed must be an integer >= 0"),
        ("parallel=tp", "parallel must be 'ddp' or 'fsdp'"),
    ],
)
def test_out_of_range_settings_are_refused_with_the_allowed_range(setting, expected, tmp_path, capsys, monkeypatch):
    with pytest.raises(ValueError, match=re.escape(expected)):
        apply_overrides(TrainConfig(lr=1e-3), [setting]).resolved()
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--preset", "gla-tiny", "--max-steps", "2", "--set", "lr=0.001", "--set", setting]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_model_vocabulary_smaller_than_the_tokenizers_is_refused(store, tmp_path, capsys, monkeypatch):
    """--set model.vocab_size=10 with a 400-token tokenizer was an IndexError traceback mid-step."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--preset", "gla-tiny", "--data", store, "--max-steps", "2", "--set", "seq_len=32", "--set", "global_batch_size=4",
            "--set", "model.hidden_size=32", "--set", "model.num_heads=2", "--set", "tensorboard=false", "--set", "model.vocab_size=10"]  # fmt: skip
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "model.vocab_size 10 is smaller than the tokenizer's vocabulary of 400 tokens" in err[0], err
    assert not (tmp_path / "out").exists()


# Settings a run started from another's train_config.json may record otherwise: none (its
# --out is no setting, and data, tokenizer and cache are recorded as absolute paths).
MAY_DIFFER_FROM_THE_FILE: tuple[str, ...] = ()


def test_a_run_started_from_a_runs_config_file_repeats_it(store, tmp_path, monkeypatch):
    """`srope train --config FIRST/train_config.json --out SECOND` records the first run's settings
    and computes its losses bitwise; options and --set on top change what they name, and the
    run records the settings it ran with."""
    monkeypatch.chdir(tmp_path)
    sets = ["seq_len=32", "global_batch_size=4", "checkpoint_every=2", "eval_rows=8", "tensorboard=false", "lr=3e-3", 'model={"hidden_size": 32, "num_heads": 2}']
    assert main(["train", "--preset", "gla-tiny", "--data", store, "--max-steps", "3", "--out", "first", *(f"--set={s}" for s in sets)]) == 0
    assert main(["train", "--config", "first/train_config.json", "--out", "second"]) == 0
    first, second = (json.loads((tmp_path / run / "train_config.json").read_text()) for run in ("first", "second"))
    assert {k: v for k, v in second.items() if k not in MAY_DIFFER_FROM_THE_FILE} == {k: v for k, v in first.items() if k not in MAY_DIFFER_FROM_THE_FILE}
    assert first["position"] == "selective_rope" and first["data"] == store
    assert losses(tmp_path / "second") == losses(tmp_path / "first")  # bitwise
    argv = ["train", "--config", "first/train_config.json", "--max-steps", "2", "--set", "lr=1e-3", "--set", "position.gate=null", "--out", "third"]
    assert main(argv) == 0
    third = json.loads((tmp_path / "third" / "train_config.json").read_text())
    assert third == {**first, "max_steps": 2, "lr": 1e-3, "position": {"type": "selective_rope", "gate": None}}
    assert json.loads((tmp_path / "third" / "run.json").read_text())["config"] == third
