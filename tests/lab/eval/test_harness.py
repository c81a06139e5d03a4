"""``srope lm-eval``: lm-eval-harness runs in-process on an srope model folder over local
YAML tasks (2-choice loglikelihood, loglikelihood_rolling perplexity, greedy generation),
batched (right padding for loglikelihood, left padding for generation), and its numbers
equal a direct computation with our model, one sequence at a time without a cache."""

from __future__ import annotations

import argparse
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

import srope.models  # noqa: F401  (Auto registration)
from srope.lab.eval.cli import add_eval_commands
from srope.lab.eval.harness import lm_eval_argv, model_args, parse_model_args
from tests.lab.eval.conftest import TRAIN_SEQ_LEN
from tests.lab.train.conftest import make_text

MAX_GEN = 6
NO_MATCH = "<never generated>"


@pytest.fixture(scope="module")
def random_model(tmp_path_factory, tokenizer_dir) -> Path:
    """A random Selective RoPE GLA with large initial weights, saved with its tokenizer: unlike a
    model trained for a few steps on word salad, its greedy continuations depend on the prompt,
    and its top-2 logits stay far apart (float32 batching noise cannot flip an argmax)."""
    from srope.models import SRopeForCausalLM, preset_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(3)
    config = preset_config("gla-tiny", position="selective_rope", vocab_size=len(tokenizer), hidden_size=32, num_heads=2, initializer_range=0.3)
    folder = tmp_path_factory.mktemp("random_model")
    SRopeForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_and_tokenizer(random_model):
    model = AutoModelForCausalLM.from_pretrained(random_model, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(random_model)


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for every t, float64, one full forward, no cache."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]), use_cache=False).logits[0].double()
    return F.log_softmax(logits, -1)


def _continuation_loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """lm-eval's documented split: trailing context spaces move to the continuation; the
    continuation's tokens are those of context+continuation after the context's (with <s>)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, ctx = tokenizer(context + continuation).input_ids, tokenizer(context).input_ids
    cont = whole[len(ctx) :]
    logp = _logprobs(model, whole[:-1])
    return sum(logp[len(ctx) - 1 + i, token].item() for i, token in enumerate(cont))


def _greedy(model, tokenizer, prompt: str) -> str:
    """Greedy decoding by full recomputation (no cache), stopping at </s>, cut at the stop string."""
    ids = tokenizer(prompt).input_ids
    new = []
    for _ in range(MAX_GEN):
        token = int(_logprobs(model, ids + new)[-1].argmax())
        if token == tokenizer.eos_token_id:
            break
        new.append(token)
    return tokenizer.decode(new, skip_special_tokens=True).split("\n\n")[0]


def _write_tasks(folder: Path, data: dict[str, list[dict]]) -> None:
    files = {}
    for name, docs in data.items():
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    head = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {file}\ntest_split: test\n"
    (folder / "srope_mc.yaml").write_text(
        "task: srope_mc\n" + head.format(file=files["mc"]) + "output_type: multiple_choice\n"
        'doc_to_text: "Q: {{q}}\\nA:"\ndoc_to_target: label\ndoc_to_choice: "{{[a, b]}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\nmetadata:\n  version: 1.0\n"
    )
    (folder / "srope_roll.yaml").write_text(
        "task: srope_roll\n" + head.format(file=files["roll"]) + "output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\nmetadata:\n  version: 1.0\n"
    )
    (folder / "srope_gen.yaml").write_text(
        "task: srope_gen\n" + head.format(file=files["gen"]) + "output_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        f'generation_kwargs:\n  until: ["\\n\\n"]\n  max_gen_toks: {MAX_GEN}\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\nmetadata:\n  version: 1.0\n"
    )


def _samples(out: Path, task: str) -> list[dict]:
    (file,) = out.rglob(f"samples_{task}_*.jsonl")
    return sorted((json.loads(line) for line in file.read_text().splitlines()), key=lambda s: s["doc_id"])


def test_lm_eval_local_tasks_equal_a_direct_computation(random_model, model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    rng = random.Random(11)
    mc = [{"q": make_text(rng, rng.randint(2, 9)).strip(), "a": make_text(rng, rng.randint(1, 4)).strip(),
           "b": make_text(rng, rng.randint(1, 4)).strip(), "label": rng.randint(0, 1)} for _ in range(16)]  # fmt: skip
    roll = [{"text": make_text(rng, rng.randint(5, 60)).strip()} for _ in range(5)]
    prompts = [make_text(rng, rng.randint(1, 12)).strip() for _ in range(5)]
    generated = [_greedy(model, tokenizer, p) for p in prompts]
    assert all(generated) and len(set(generated)) == len(generated), generated  # prompt-dependent
    # Half of the targets are what our own greedy decoding produced: exact_match must be 3/5.
    gen = [{"prompt": p, "answer": g if i % 2 == 0 else NO_MATCH} for i, (p, g) in enumerate(zip(prompts, generated, strict=True))]
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _write_tasks(tasks, {"mc": mc, "roll": roll, "gen": gen})

    parser = argparse.ArgumentParser(prog="srope")
    add_eval_commands(parser.add_subparsers(dest="command"))
    out = tmp_path / "lm_eval"
    args = parser.parse_args([
        "lm-eval", "--model", str(random_model), "--tasks", "srope_mc,srope_roll,srope_gen", "--include-path", str(tasks),
        "--batch-size", "3", "--device", "cpu", "--dtype", "float32", "--max-length", "512", "--output-path", str(out),
        "--log-samples", "--", "--seed", "0",
    ])  # fmt: skip
    assert args.func(args) == 0
    (results_file,) = out.rglob("results_*.json")
    report = json.loads(results_file.read_text())
    results = report["results"]
    assert report["config"]["model_args"]["pretrained"] == str(random_model.resolve())
    assert report["config"]["batch_size"] == "3"

    # Multiple choice: per-choice log-likelihoods, acc and acc_norm.
    lls = np.array([[_continuation_loglikelihood(model, tokenizer, f"Q: {d['q']}\nA:", " " + d[c]) for c in "ab"] for d in mc])
    theirs = np.array([[float(r[0][0]) for r in s["resps"]] for s in _samples(out, "srope_mc")])
    np.testing.assert_allclose(theirs, lls, rtol=1e-5, atol=1e-4)
    labels = np.array([d["label"] for d in mc])
    lengths = np.array([[len(d["a"]), len(d["b"])] for d in mc], dtype=float)
    acc, acc_norm = np.mean(lls.argmax(1) == labels), np.mean((lls / lengths).argmax(1) == labels)
    assert 0 < acc < 1, "a degenerate task (every answer right or wrong) would not test the comparison"
    assert results["srope_mc"]["acc,none"] == pytest.approx(acc, abs=1e-12)
    assert results["srope_mc"]["acc_norm,none"] == pytest.approx(acc_norm, abs=1e-12)

    # Rolling perplexity: each text is one window ([<s>] + its tokens, which start with <s>).
    total, words, nbytes = 0.0, 0, 0
    for doc, sample in zip(roll, _samples(out, "srope_roll"), strict=True):
        ids = tokenizer(doc["text"]).input_ids
        assert len(ids) < 512
        logp = _logprobs(model, [tokenizer.bos_token_id] + ids[:-1])
        ll = sum(logp[t, token].item() for t, token in enumerate(ids))
        assert float(sample["resps"][0][0]) == pytest.approx(ll, rel=1e-5)
        total, words, nbytes = total + ll, words + len(re.split(r"\s+", doc["text"])), nbytes + len(doc["text"].encode())
    assert results["srope_roll"]["word_perplexity,none"] == pytest.approx(math.exp(-total / words), rel=1e-5)
    assert results["srope_roll"]["bits_per_byte,none"] == pytest.approx(-total / nbytes / math.log(2), rel=1e-5)

    # Generation: lm-eval's batched, left-padded, cached generate equals our greedy loop.
    assert [s["filtered_resps"][0] for s in _samples(out, "srope_gen")] == generated
    assert results["srope_gen"]["exact_match,none"] == pytest.approx(3 / 5)


def test_model_args_and_argv(trained_run, tmp_path):
    args = model_args(trained_run, device="cpu", dtype="float32")
    assert args == {"pretrained": str((trained_run / "model").resolve()), "backend": "causal", "dtype": "float32", "max_length": TRAIN_SEQ_LEN}
    mixed = model_args(trained_run / "model", device="cpu", dtype="bfloat16", max_length=4096, extra={"add_bos_token": "True"})
    assert mixed["mixed_precision_dtype"] == "bfloat16" and mixed["softmax_dtype"] == "float32" and mixed["max_length"] == 4096
    assert mixed["dtype"] == "float32" and mixed["add_bos_token"] == "True"
    argv = lm_eval_argv(trained_run, "piqa,arc_easy", device="cpu", dtype="float32", limit=10, batch_size=16, num_fewshot=0, output_path=tmp_path, extra=["--write_out"])
    assert argv[:2] == ["--model", "hf"] and argv[argv.index("--tasks") + 1] == "piqa,arc_easy"
    assert argv[argv.index("--limit") + 1] == "10" and argv[-1] == "--write_out" and argv[argv.index("--device") + 1] == "cpu"
    assert parse_model_args("a=1,b=x=y") == {"a": "1", "b": "x=y"}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tasks": ""}, ValueError, "at least one lm-eval task"),
        ({"batch_size": "0"}, ValueError, "batch_size must be"),
        ({"batch_size": "many"}, ValueError, "batch_size must be"),
        ({"limit": -1}, ValueError, "limit must be a positive number"),
        ({"num_fewshot": -1}, ValueError, "num_fewshot must be"),
        ({"max_length": 0}, ValueError, "max_length must be a positive integer"),
        ({"dtype": "float16"}, ValueError, "dtype must be one of"),
        ({"log_samples": True}, ValueError, "needs an output_path"),
        ({"include_path": "/nonexistent/tasks"}, ValueError, "include_path must be a folder"),
        ({"extra_model_args": {"tokenizer": "a,b"}}, ValueError, "may not contain"),
    ],
)
def test_bad_lm_eval_arguments_raise(trained_run, kwargs, error, match):
    call = {"tasks": "piqa", "device": "cpu"} | kwargs
    with pytest.raises(error, match=match):
        lm_eval_argv(trained_run, **call)


def test_not_a_model_folder_raises(tmp_path):
    with pytest.raises(ValueError, match="not a model folder"):
        lm_eval_argv(tmp_path, "piqa", device="cpu")
    with pytest.raises(ValueError, match="key=value"):
        parse_model_args("dtype")


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda config: {**config, "model_type": "llama"}, "has model_type 'llama', not 'srope'"),
        (lambda config: {k: v for k, v in config.items() if k != "model_type"}, "has no model_type"),
        (lambda config: {**config, "num_hidden_layers": config["num_hidden_layers"] + 1}, "do not match"),
    ],
    ids=["llama", "no-model-type", "layers"],
)
def test_lm_eval_refuses_a_model_folder_that_srope_eval_refuses(random_model, tmp_path, capsys, monkeypatch, change, expected):
    """Another library's config.json, or one that disagrees with the weights, is one line before
    lm-eval starts (its HFLM loaded such a folder: another library's model, or random weights)."""
    import shutil

    from srope.lab.cli import main
    from srope.lab.eval import harness

    model = tmp_path / "model"
    shutil.copytree(random_model, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(change(config)))
    with pytest.raises(ValueError, match=re.escape(expected)):
        lm_eval_argv(model, "piqa", device="cpu")
    monkeypatch.setattr(harness, "run_lm_eval", lambda argv: pytest.fail(f"lm-eval started on {model}"))
    assert main(["lm-eval", "--model", str(model), "--tasks", "piqa", "--device", "cpu"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("srope lm-eval: error: ") and expected in lines[0] and str(model / "config.json") in lines[0], lines
