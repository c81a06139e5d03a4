"""The GPU checks of the Selective RoPE patch series (issue 76) in one run, one JSON (CUDA only; not run in CI).

Checks (``--only`` picks some; each has a time budget, ``--budget NAME=SECONDS``):

- ``tests``: the series' own ``tests/ops/test_selective_rope.py`` (taken from patch 0004) under pytest, against the
  installed patched fla;
- ``logits``: a small fla ``GLAForCausalLM`` with ``use_selective_rope`` (the paper's options, and a second set that
  reaches the module's other parameters), saved and converted by ``srope.models.convert_fla`` into srope's
  ``SRopeForCausalLM``: logits in float32 and under bf16 autocast; ``SelectiveRotaryEmbedding`` against srope's
  ``SelectiveRoPE`` (same state_dict) with packed sequences; fla's Gated DeltaNet with the option, forward; a training
  step of fla's GLA with the option synchronises the host no more often than fla's NoPE GLA (CUDA's sync debug mode);
- ``speed``: training tokens/s of fla's GLA with ``use_selective_rope`` against fla's NoPE GLA at ``--preset``
  (gla-370m), B 8 x 4096: float32 weights, bf16 autocast, fla's own loss, fused AdamW, eager; the two models' steps
  interleaved, medians after warm-up;
- ``fla-tests``: fla's own GLA tests from a checkout of fla's repository (``--fla-tests PATH``; the sdists have no
  ``tests/``), against the installed fla.

The pytest checks run in a child process that is stopped at its budget; the others look at the clock between steps.
``--autotune first`` (the default) gives the value checks (``tests``, ``logits``, ``fla-tests``) each Triton kernel's
first candidate configuration (``srope.lab.tasks.autotune``): every configuration computes the same values up to
rounding, and timing dozens of candidates per new shape (fla's chunk kernels: minutes) would spend the budget before
the checks ran. ``speed`` always autotunes fully: its numbers are the ones a user gets.
The JSON is rewritten after every check, so a run cut short keeps what it measured.

    PYTHONPATH=SITE:src python integrations/fla/check_gpu.py --out out/fla-check-gpu.json [--fla-tests PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

from srope.lab.tasks import autotune

HERE = Path(__file__).resolve().parent
SERIES_TEST = "tests/ops/test_selective_rope.py"
FLA_GLA_TESTS = ("tests/ops/test_gla.py", "tests/models/test_modeling_gla.py")
BUDGETS = {"tests": 90.0, "logits": 60.0, "speed": 120.0, "fla-tests": 90.0}
VALUE_CHECKS = ("tests", "logits", "fla-tests")  # compare values: --autotune applies to them
# a pytest child with srope's autotune mode applied before fla's kernels are imported
PYTEST_WITH_AUTOTUNE = "import sys, pytest; from srope.lab.tasks import autotune; autotune.apply(); sys.exit(pytest.main(sys.argv[1:]))"
# the paper's Selective RoPE (docs/fla.md's example), and options that reach the module's other parameters
PAPER = dict(projection="full-rank", gate="standard", bias=False, spectrum="rope", theta=500000.0, max_temperature=1.0)
OTHERS = dict(projection="low-rank", gate="per-channel", bias=True, spectrum="rfa", rotary_dim=16)
# small enough to build in seconds (head size 32); T > 64 so fla's GLA layer takes its chunk path, as in training
SMALL = dict(hidden_size=256, num_hidden_layers=2, num_heads=4, use_short_conv=True, vocab_size=512)
FLOAT32_TOLERANCE = 5e-3  # fla's float32 kernels use TF32 products (fla's own tests allow 5e-3)
BF16_TOLERANCE = 1e-2
MIN_SPEED_RATIO = 0.95
OUTCOME = re.compile(r"^(\S.*::.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.MULTILINE)


# --------------------------------------------------------------------------- command line


def parse_budgets(text: str) -> dict[str, float]:
    budgets = dict(BUDGETS)
    for item in filter(None, text.split(",")):
        name, _, seconds = item.partition("=")
        if name not in BUDGETS or not re.fullmatch(r"\d+(\.\d*)?", seconds):
            raise argparse.ArgumentTypeError(f"expected NAME=SECONDS with NAME in {', '.join(BUDGETS)}, got {item!r}")
        budgets[name] = float(seconds)
    return budgets


def parse_checks(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in BUDGETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(BUDGETS)}, got {text!r}")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", type=parse_checks,
                   help=f"comma-separated checks to run: {', '.join(BUDGETS)} (default: all, fla-tests when --fla-tests is given)")
    p.add_argument("--budget", type=parse_budgets, default=dict(BUDGETS),
                   help="seconds per check, NAME=SECONDS[,...] (default: " + ",".join(f"{k}={v:g}" for k, v in BUDGETS.items()) + ")")
    p.add_argument("--out", type=Path, default=Path("out/fla-check-gpu.json"), help="the JSON (rewritten after every check)")
    p.add_argument("--fla-tests", type=Path, metavar="PATH", help="a checkout of fla's repository (its tests/ folder is used)")
    p.add_argument("--fla-test-files", default=",".join(FLA_GLA_TESTS), help="test files under PATH (comma-separated)")
    p.add_argument("--autotune", choices=("first", "full"), default="first",
                   help="Triton autotuning in the value checks (tests, logits, fla-tests): first candidate, or all (default: first)")
    p.add_argument("--preset", default="gla-370m", help="srope's preset whose shape the speed check gives fla's GLA")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of each model (the first one autotunes)")
    p.add_argument("--steps", type=int, default=6, help="timed steps of each model, interleaved")
    return p


# --------------------------------------------------------------------------- pytest in a child process


def series_test_file(folder: Path) -> Path:
    """The series' new test file, written into ``folder`` from patch 0004 (a new file: its hunk is all '+' lines)."""
    patch = next((HERE / "patches").glob("0004-*.patch")).read_text(encoding="utf-8")
    section = patch.split(f"diff --git a/{SERIES_TEST} b/{SERIES_TEST}\n", 1)[1]
    hunk = section.split("\n@@ ", 1)[1].split("\n", 1)[1]
    lines = []
    for line in hunk.split("\n"):
        if not line.startswith("+"):
            break
        lines.append(line[1:])
    target = folder / SERIES_TEST
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def run_pytest(files: list[Path], rootdir: Path, budget: float, tune: str = "full") -> dict:
    """pytest -v on ``files`` in a child process, stopped after ``budget`` seconds; the outcome of every test it ran.
    The installed fla is the one tested, never a checkout's ``fla/``: a neutral working folder, ``--import-mode=append``
    and an empty config file (fla's pyproject.toml puts its checkout first on sys.path; srope's adds its own options).
    ``tune``: srope's autotune mode (``srope.lab.tasks.autotune``) in the child."""
    with tempfile.TemporaryDirectory() as cwd:
        (Path(cwd) / "pytest.ini").write_text("[pytest]\n")
        runner = ["-m", "pytest"] if tune == "full" else ["-c", PYTEST_WITH_AUTOTUNE]
        command = [sys.executable, *runner, "-v", "-p", "no:cacheprovider", "--import-mode=append", "-c", f"{cwd}/pytest.ini",
                   "--rootdir", str(rootdir), *map(str, files)]
        try:
            env = _absolute_pythonpath() | {autotune.ENV: tune}
            done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=budget)
            output, code, timed_out = done.stdout, done.returncode, False
        except subprocess.TimeoutExpired as stopped:
            output, code, timed_out = stopped.stdout or b"", None, True
    output = output.decode(errors="replace")
    outcomes = OUTCOME.findall(output)
    counts = {kind: sum(1 for _, k in outcomes if k == kind) for kind in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    failed = [name for name, kind in outcomes if kind in ("FAILED", "ERROR")]
    return {"passed": code == 0 and counts["PASSED"] > 0, "returncode": code, "timed_out": timed_out, "tests": counts,
            "failures": failed[:30], "command": " ".join(command), "tail": output[-4000:]}


def _absolute_pythonpath() -> dict[str, str]:
    """This environment with PYTHONPATH's folders made absolute: the child runs elsewhere (``PYTHONPATH=SITE:src``)."""
    folders = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(folders)}


def check_tests(args, budget: float) -> dict:
    _require_patched()
    with tempfile.TemporaryDirectory() as folder:
        test_file = series_test_file(Path(folder))
        return run_pytest([test_file], Path(folder), budget, args.autotune)


def check_fla_tests(args, budget: float) -> dict:
    files = [args.fla_tests / name for name in args.fla_test_files.split(",") if name]
    absent = [str(f) for f in files if not f.is_file()]
    if absent:
        raise ValueError(f"not in the fla checkout: {absent}")
    return {"fla_patched": _patched(), **run_pytest(files, args.fla_tests, budget, args.autotune)}


# --------------------------------------------------------------------------- logits: fla's model against srope's


def _patched() -> bool:
    return importlib.util.find_spec("fla") is not None and importlib.util.find_spec("fla.ops.selective_rope") is not None


def _require_patched() -> None:
    if importlib.util.find_spec("fla") is None:
        raise RuntimeError("fla is not importable: install the patched wheels (integrations/fla/README.md, GPU check)")
    if not _patched():
        raise RuntimeError("fla is not the patched build: no fla.ops.selective_rope (install dist/fla/*.whl from build_wheel.sh)")


def fla_and_srope(selective_rope: dict, folder: Path, seed: int = 0, **fields):
    """A small fla ``GLAForCausalLM`` with ``use_selective_rope`` (its rotary parameters moved off their initial zeros
    and ones), saved to ``folder``, and the srope model ``convert_fla`` makes of that folder. On the CPU."""
    from fla.models import GLAConfig, GLAForCausalLM

    from srope.models.convert_fla import load_fla

    torch.manual_seed(seed)
    fla_model = GLAForCausalLM(GLAConfig(**{**SMALL, **fields}, use_selective_rope=True, selective_rope=selective_rope))
    with torch.no_grad():
        for name, param in fla_model.named_parameters():
            if ".rotary." in name:
                param.add_(0.1 * torch.randn_like(param))
    fla_model.save_pretrained(folder)
    return fla_model, load_fla(folder)


def errors(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    """Relative RMS error (fla's get_err_ratio), largest absolute error and the largest |expected|."""
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all():
        return {"rel_err": float("nan"), "max_abs_err": float("nan"), "max_abs": float(e.abs().max())}
    return {"rel_err": float((a - e).norm() / e.norm()), "max_abs_err": float((a - e).abs().max()), "max_abs": float(e.abs().max())}


def compare_logits(fla_model, srope_model, ids: torch.Tensor) -> dict:
    """float32 and bf16-autocast logits of the two models. bf16 tolerance: the larger of 1e-2 and twice fla's own
    bf16-vs-float32 error (the two models round at different places)."""
    logits = {}
    with torch.no_grad():
        for mode in ("float32", "bf16"):
            autocast = torch.autocast("cuda", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext()
            logits[mode] = []
            for name, model in (("fla", fla_model), ("srope", srope_model)):
                began = time.perf_counter()
                with autocast:
                    logits[mode].append(model(ids, use_cache=False).logits.float())
                if ids.is_cuda:
                    torch.cuda.synchronize()
                # the first call of a dtype compiles and autotunes fla's kernels: say where the time goes
                print(f"    {name} {mode} forward: {time.perf_counter() - began:.1f} s", flush=True)
    result = {"float32": errors(logits["float32"][1], logits["float32"][0]), "bf16": errors(logits["bf16"][1], logits["bf16"][0]),
              "fla_bf16_vs_float32": errors(logits["bf16"][0], logits["float32"][0]),
              "srope_bf16_vs_float32": errors(logits["bf16"][1], logits["float32"][0])}
    result["bf16_tolerance"] = max(BF16_TOLERANCE, 2 * result["fla_bf16_vs_float32"]["rel_err"])
    result["passed"] = bool(result["float32"]["rel_err"] <= FLOAT32_TOLERANCE and result["bf16"]["rel_err"] <= result["bf16_tolerance"])
    return result


def compare_modules(options: dict) -> dict:
    """fla's SelectiveRotaryEmbedding (fla's ShortConvolution, on the GPU) loaded with srope's SelectiveRoPE's
    state_dict: rotated q and k in float32, packed sequences."""
    from fla.modules import SelectiveRotaryEmbedding

    from srope.modules import SelectiveRoPE

    torch.manual_seed(1)
    ours = SelectiveRoPE(256, 4, 64, **options).cuda()
    with torch.no_grad():
        for param in ours.parameters():
            param.add_(0.1 * torch.randn_like(param))
    theirs = SelectiveRotaryEmbedding(256, 4, 64, **options).cuda()
    theirs.load_state_dict(ours.state_dict())
    cu_seqlens = torch.tensor([0, 1, 100, 333, 600], device="cuda")
    x, q, k = torch.randn(1, 600, 256, device="cuda"), torch.randn(1, 600, 8, 64, device="cuda"), torch.randn(1, 600, 4, 64, device="cuda")
    with torch.no_grad():
        expected = torch.cat(ours(q, k, x, cu_seqlens=cu_seqlens)[:2], 2)
        actual = torch.cat(theirs(q, k, x, cu_seqlens=cu_seqlens)[:2], 2)
    result = errors(actual, expected)
    return result | {"passed": bool(result["rel_err"] <= 1e-4)}


def gated_deltanet_forward(folder: Path) -> dict:
    """fla's Gated DeltaNet with ``use_selective_rope``: forward, finite, and its config round trip (srope has no
    converter for fla's GDN checkpoints; the rotation is the module compared above). Its backward is left out: fla's
    gated chunk backward refuses to run on Hopper with Triton >= 3.4, < 3.7.1 (fla issue #640)."""
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    torch.manual_seed(2)
    config = GatedDeltaNetConfig(hidden_size=256, num_hidden_layers=2, num_heads=4, head_dim=64, vocab_size=512,
                                 use_selective_rope=True, selective_rope=PAPER)
    model = GatedDeltaNetForCausalLM(config).cuda().eval()
    model.save_pretrained(folder)
    again = GatedDeltaNetForCausalLM.from_pretrained(folder).cuda().eval()
    ids = torch.randint(0, 512, (2, 256), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logits, reloaded = model(ids).logits, again(ids).logits
    reload = errors(reloaded, logits)
    return {"finite": bool(torch.isfinite(logits).all()), "reload": reload, "passed": bool(reload["rel_err"] <= 1e-5)}


def synchronisations(model, ids: torch.Tensor) -> int:
    """How many times a training step (forward, backward) of ``model`` synchronises the host with the GPU after a
    warm-up step (CUDA's sync debug mode, warning on each): an eager step that waits for the GPU cannot queue the
    next layer's kernels while the current ones run."""
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(input_ids=ids, labels=ids).loss.backward()

    step()  # warm-up: autotuning and lazy initialisation may synchronise once
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


def training_sync(folder: Path) -> dict:
    """fla's GLA with and without ``use_selective_rope``: how often a training step waits for the GPU. Passes when
    the Selective RoPE model waits no more often than fla's NoPE model (whose waits are not the series')."""
    from fla.models import GLAConfig, GLAForCausalLM

    ids = torch.randint(0, SMALL["vocab_size"], (2, 256), device="cuda")
    waits = {}
    for name, extra in (("nope", {}), ("selective_rope", {"use_selective_rope": True, "selective_rope": PAPER})):
        torch.manual_seed(4)
        with torch.device("cuda"):
            model = GLAForCausalLM(GLAConfig(**SMALL, **extra))
        waits[name] = synchronisations(model, ids)
    return {"sync": waits, "passed": waits["selective_rope"] <= waits["nope"]}


def check_logits(args, budget: float) -> dict:
    _require_patched()
    began, result = time.perf_counter(), {"passed": False}
    ids = torch.randint(0, SMALL["vocab_size"], (2, 256), generator=torch.Generator().manual_seed(3)).cuda()
    steps = [("gla_paper", lambda folder: compare_logits(*(m.cuda().eval() for m in fla_and_srope(PAPER, folder)), ids)),
             ("gla_others", lambda folder: compare_logits(*(m.cuda().eval() for m in fla_and_srope(OTHERS, folder)), ids)),
             ("module_paper", lambda folder: compare_modules(PAPER)),
             ("module_others", lambda folder: compare_modules(OTHERS)),
             ("gated_deltanet", gated_deltanet_forward),
             ("training_sync", training_sync)]
    for name, step in steps:
        if time.perf_counter() - began > budget:
            result["cut_short"] = f"over the {budget:g} s budget before {name}"
            return result
        with tempfile.TemporaryDirectory() as folder:
            try:
                result[name] = step(Path(folder))
            except Exception as error:  # the other comparisons still run
                result[name] = {"passed": False, "error": _error_text(error)}
        print(f"  logits {name}: {json.dumps(result[name])}", flush=True)
    result["passed"] = all(result[name]["passed"] for name, _ in steps)
    return result


# --------------------------------------------------------------------------- speed at gla-370m


def fla_gla(preset: str, use_selective_rope: bool):
    """fla's GLAForCausalLM with the shape of srope's ``preset`` (as benchmarks/bench_train.py builds it)."""
    from fla.models import GLAConfig, GLAForCausalLM

    from srope.models import PRESETS

    shape = {key: PRESETS[preset].config[key] for key in
             ("hidden_size", "num_hidden_layers", "num_heads", "expand_k", "expand_v", "use_short_conv", "vocab_size")}
    config = GLAConfig(**shape, use_selective_rope=use_selective_rope, selective_rope=PAPER if use_selective_rope else None)
    with torch.device("cuda"):  # initialised in place: a 370M model's CPU initialisation takes longer than its steps
        return GLAForCausalLM(config)


def training_step(model):
    """The lab's plain eager step (srope.lab.step) on fla's own loss under bf16 autocast, fused AdamW, clipping at 1:
    the step benchmarks/bench_train.py times fla's model with."""
    from srope.lab.step import optimizer_step
    from srope.lab.train.optim import adamw

    def loss(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(input_ids=ids, labels=ids).loss

    optimizer = adamw(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    return optimizer_step(model, optimizer, loss, grad_clip=1.0)


def timed(step, ids) -> tuple[float, float, float]:
    """Seconds, loss and peak GiB of one step."""
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    began = time.perf_counter()
    loss = step(0, 1e-4, ids)
    torch.cuda.synchronize()
    return time.perf_counter() - began, float(loss), torch.cuda.max_memory_allocated() / 2**30


def check_speed(args, budget: float) -> dict:
    _require_patched()
    began = time.perf_counter()
    names = ("nope", "selective_rope")
    models, steps, times, last = {}, {}, {name: [] for name in names}, {}
    for name in names:
        torch.manual_seed(0)
        models[name] = fla_gla(args.preset, name == "selective_rope")
        steps[name] = training_step(models[name])
    model = models["nope"]
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.length), device=next(model.parameters()).device)
    result = {"shape": [args.batch, args.length], "preset": args.preset, "options": PAPER}
    for round_ in range(args.warmup + args.steps):
        # alternate which model goes first, so neither always follows the other's optimiser step
        for name in names if round_ % 2 == 0 else names[::-1]:
            seconds, loss, peak = timed(steps[name], ids)
            if round_ >= args.warmup:
                times[name].append(seconds)
            last[name] = {"loss": loss, "peak_gib": peak}
        if round_ >= args.warmup and time.perf_counter() - began > budget:
            result["cut_short"] = f"over the {budget:g} s budget after {round_ + 1 - args.warmup} timed steps"
            break
    for name in names:
        median = statistics.median(times[name])
        result[name] = {"tokens_per_s": args.batch * args.length / median, "step_s": median, "steps_s": times[name], **last[name]}
    result["ratio"] = result["selective_rope"]["tokens_per_s"] / result["nope"]["tokens_per_s"]
    result["passed"] = bool(result["ratio"] >= MIN_SPEED_RATIO and all(math.isfinite(last[name]["loss"]) for name in names))
    result["note"] = "peak_gib: during that model's step, with both models' weights and optimiser states resident"
    del models, steps
    torch.cuda.empty_cache()
    return result


# --------------------------------------------------------------------------- the run


CHECKS = {"tests": check_tests, "logits": check_logits, "speed": check_speed, "fla-tests": check_fla_tests}


def environment() -> dict:
    from srope.lab import provenance

    info = provenance.record(**provenance.environment("cuda"))
    if importlib.util.find_spec("fla") is not None:
        import fla

        info |= {"fla_file": fla.__file__, "fla_patched": _patched()}
    return info


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    checks = args.only or [name for name in BUDGETS if name != "fla-tests" or args.fla_tests is not None]
    if "fla-tests" in checks and args.fla_tests is None:
        p.error("the fla-tests check needs --fla-tests PATH (a checkout of fla's repository)")
    if not torch.cuda.is_available():
        p.error("needs CUDA (fla's kernels): run it on the GPU machine")
    report = {"environment": environment(), "checks": {}}
    for name in checks:
        began = time.perf_counter()
        print(f"{name}: budget {args.budget[name]:g} s", flush=True)
        try:
            with autotune.scoped(args.autotune if name in VALUE_CHECKS else "full"):
                record = CHECKS[name](args, args.budget[name]) | ({"autotune": args.autotune} if name in VALUE_CHECKS else {})
        except Exception as error:
            record = {"passed": False, "error": _error_text(error)}
        record["seconds"] = round(time.perf_counter() - began, 1)
        report["checks"][name] = record
        report["passed"] = all(r["passed"] for r in report["checks"].values())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"{name}: {'PASSED' if record['passed'] else 'FAILED'} in {record['seconds']} s  {summary(name, record)}", flush=True)
    print(f"wrote {args.out}")
    return 0 if report.get("passed") else 1


def _error_text(error: Exception) -> str:
    return "".join(traceback.format_exception(error)).strip()[-3000:]


def summary(name: str, record: dict) -> str:
    """The numbers of a check in one line."""
    if "error" in record:
        return record["error"].splitlines()[-1]
    if name in ("tests", "fla-tests"):
        return (", ".join(f"{n} {kind.lower()}" for kind, n in record["tests"].items())
                + (" (stopped at its budget)" if record["timed_out"] else ""))
    if name == "logits":
        parts = []
        for step, value in record.items():
            if not isinstance(value, dict):
                continue
            if "error" in value:
                parts.append(f"{step}: error")
            elif "sync" in value:
                parts.append(f"{step}: " + ", ".join(f"{name} {count} waits" for name, count in value["sync"].items()))
            elif "float32" in value:
                parts.append(f"{step}: rel err fp32 {value['float32']['rel_err']:.1e}, bf16 {value['bf16']['rel_err']:.1e}")
            else:
                parts.append(f"{step}: rel err {value.get('rel_err', value.get('reload', {}).get('rel_err', float('nan'))):.1e}")
        return "; ".join(parts) + (f" ({record['cut_short']})" if "cut_short" in record else "")
    if name == "speed":
        return (f"nope {record['nope']['tokens_per_s']:,.0f} tok/s, selective_rope {record['selective_rope']['tokens_per_s']:,.0f}"
                f" tok/s, ratio {record['ratio']:.3f} (>= {MIN_SPEED_RATIO})" + (f" ({record['cut_short']})" if "cut_short" in record else ""))
    return ""


if __name__ == "__main__":
    sys.exit(main())
