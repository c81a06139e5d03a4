"""integrations/fla/check_gpu.py, the GPU checks of the fla patch series, on the CPU: its command line, the test
file it takes from patch 0004, and the pytest runs it makes (outcomes, budget, which fla is imported). Its model
checks need CUDA; the weight mapping they rely on is tested in test_fla_patch.py and tests/models/test_convert_fla.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import srope

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "integrations" / "fla" / "check_gpu.py"
SROPE_ENV = {**os.environ, "PYTHONPATH": str(Path(srope.__file__).resolve().parents[1])}  # the srope under test


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check_gpu():
    return _load("check_gpu", SCRIPT)


def test_the_script_starts_and_prints_its_checks(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], cwd=tmp_path, env=SROPE_ENV, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout and all(name in done.stdout for name in ("tests", "logits", "speed", "fla-tests"))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--only", "logits,nothing"], "expected a comma-separated list of tests, logits, speed, fla-tests"),
        (["--budget", "speed=fast"], "expected NAME=SECONDS"),
        (["--only", "fla-tests"], "the fla-tests check needs --fla-tests PATH"),
    ],
)
def test_bad_command_lines_are_refused(check_gpu, argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        check_gpu.main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_options_parse(check_gpu):
    args = check_gpu.parser().parse_args(["--only", "logits,speed", "--budget", "speed=30,tests=5.5"])
    assert args.only == ["logits", "speed"] and args.budget == {**check_gpu.BUDGETS, "speed": 30.0, "tests": 5.5}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_it_says_so(check_gpu, capsys, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        check_gpu.main(["--out", str(tmp_path / "out.json")])
    assert stopped.value.code == 2 and "needs CUDA" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_the_series_test_file_is_the_one_patch_0004_adds(check_gpu, tmp_path):
    make_patches = _load("make_patches", ROOT / "integrations" / "fla" / "make_patches.py")
    written = check_gpu.series_test_file(tmp_path)
    template = (make_patches.TEMPLATES / check_gpu.SERIES_TEST).read_text(encoding="utf-8")
    assert written == tmp_path / check_gpu.SERIES_TEST
    assert written.read_text(encoding="utf-8") == make_patches.render(template)
    assert "def test_chunk(" in written.read_text(encoding="utf-8")


OUTCOMES = """
import time
import pytest

def test_passes():
    pass

def test_fails():
    assert False

@pytest.mark.skip(reason="no")
def test_skipped():
    pass

@pytest.mark.parametrize("cu_seqlens", [[0, 15]])
def test_an_id_with_spaces(cu_seqlens):
    pass
"""


def test_pytest_outcomes_are_counted(check_gpu, tmp_path):
    (tmp_path / "test_outcomes.py").write_text(OUTCOMES)
    result = check_gpu.run_pytest([tmp_path / "test_outcomes.py"], tmp_path, budget=120)
    assert result["tests"] == {"PASSED": 2, "FAILED": 1, "ERROR": 0, "SKIPPED": 1}, result["tail"]
    assert len(result["failures"]) == 1 and result["failures"][0].endswith("test_outcomes.py::test_fails")
    assert not result["passed"] and result["returncode"] == 1 and not result["timed_out"]


def test_a_run_over_its_budget_is_stopped_and_keeps_what_ran(check_gpu, tmp_path):
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_first():\n    pass\n\ndef test_slow():\n    time.sleep(60)\n")
    result = check_gpu.run_pytest([tmp_path / "test_slow.py"], tmp_path, budget=8)
    assert result["timed_out"] and not result["passed"] and result["tests"]["PASSED"] == 1, result["tail"]


def test_a_checkouts_own_fla_is_never_imported(check_gpu, tmp_path):
    """fla's pyproject.toml puts the checkout first on sys.path (pytest's pythonpath): its unpatched fla/ would hide
    the installed one. The run ignores that config and imports test files without putting their folders first;
    the checkout's conftest.py still applies."""
    checkout = tmp_path / "fla-checkout"
    (checkout / "fla").mkdir(parents=True)
    (checkout / "fla" / "__init__.py").write_text("raise ImportError('the checkout s fla')\n")
    (checkout / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    (checkout / "tests" / "ops").mkdir(parents=True)
    # fla's tests/conftest.py (its NaN-poisoned allocations) is still loaded
    (checkout / "tests" / "conftest.py").write_text("import pytest\n\n@pytest.fixture\ndef from_conftest():\n    return 1\n")
    (checkout / "tests" / "ops" / "test_which_fla.py").write_text(
        "import importlib.util\n\ndef test_which_fla(from_conftest):\n    spec = importlib.util.find_spec('fla')\n"
        f"    assert spec is None or not spec.origin.startswith({str(checkout)!r})\n")
    result = check_gpu.run_pytest([checkout / "tests" / "ops" / "test_which_fla.py"], checkout, budget=120)
    assert result["passed"] and result["tests"]["PASSED"] == 1, result["tail"]


def test_the_logits_comparison_and_the_summaries(check_gpu):
    """The arithmetic and the printed lines of the model checks, on two copies of one srope model on the CPU
    (autocast on CUDA is a no-op here, so both modes compare float32 logits)."""
    from srope.models import SRopeConfig, SRopeForCausalLM

    torch.manual_seed(0)
    config = SRopeConfig(mixer="gla", hidden_size=32, num_hidden_layers=1, num_heads=2, vocab_size=50, position={"type": "selective_rope"})
    model = SRopeForCausalLM(config).eval()
    ids = torch.randint(0, 50, (1, 9))
    with pytest.warns(UserWarning, match="CUDA"):  # torch.autocast("cuda") without CUDA
        result = check_gpu.compare_logits(model, model, ids)
    assert result["passed"] and result["float32"]["rel_err"] == 0 and result["bf16_tolerance"] == check_gpu.BF16_TOLERANCE
    logits = {"gla_paper": result, "module_paper": {"rel_err": 1e-7, "passed": True}, "gated_deltanet": {"passed": False, "error": "x"},
              "training_sync": {"sync": {"nope": 0, "selective_rope": 24}, "passed": False}, "passed": False}
    assert check_gpu.summary("logits", logits) == ("gla_paper: rel err fp32 0.0e+00, bf16 0.0e+00; module_paper: rel err 1.0e-07; "
                                                   "gated_deltanet: error; training_sync: nope 0 waits, selective_rope 24 waits")
    speed = {"nope": {"tokens_per_s": 120000.0}, "selective_rope": {"tokens_per_s": 115000.0}, "ratio": 115 / 120}
    assert check_gpu.summary("speed", speed) == "nope 120,000 tok/s, selective_rope 115,000 tok/s, ratio 0.958 (>= 0.95)"
    assert check_gpu.summary("tests", {"tests": {"PASSED": 9, "FAILED": 0, "ERROR": 0, "SKIPPED": 0}, "timed_out": True}) == (
        "9 passed, 0 failed, 0 error, 0 skipped (stopped at its budget)")


def test_the_speed_check_interleaves_and_stops_at_its_budget(check_gpu, monkeypatch):
    """Its bookkeeping, with a small srope model for fla's and a clock for the GPU step: the steps alternate, the
    warm-up is left out, the medians give tokens/s, and a budget spent in the warm-up still times one step each."""
    from srope.models import SRopeConfig, SRopeForCausalLM

    built, calls = [], []

    def small_model(preset, use_selective_rope):
        built.append((preset, use_selective_rope))
        model = SRopeForCausalLM(SRopeConfig(mixer="gla", hidden_size=16, num_hidden_layers=1, num_heads=2, vocab_size=20))
        model.name = "selective_rope" if use_selective_rope else "nope"
        return model

    def fake_timed(name, ids):  # the "step" is the model's name here
        calls.append(name)
        return (0.2 if name == "selective_rope" else 0.1), 1.0, 0.5

    monkeypatch.setattr(check_gpu, "_require_patched", lambda: None)
    monkeypatch.setattr(check_gpu, "fla_gla", small_model)
    monkeypatch.setattr(check_gpu, "training_step", lambda model: model.name)
    monkeypatch.setattr(check_gpu, "timed", fake_timed)
    args = check_gpu.parser().parse_args(["--warmup", "1", "--steps", "3", "--batch", "2", "--length", "5"])
    result = check_gpu.check_speed(args, budget=600)
    assert built == [("gla-370m", False), ("gla-370m", True)]
    assert calls == ["nope", "selective_rope", "selective_rope", "nope", "nope", "selective_rope", "selective_rope", "nope"]
    assert result["nope"]["tokens_per_s"] == 100 and result["selective_rope"]["tokens_per_s"] == 50 and result["ratio"] == 0.5
    assert len(result["nope"]["steps_s"]) == 3 and not result["passed"] and "cut_short" not in result
    calls.clear()
    result = check_gpu.check_speed(args, budget=0)
    assert len(calls) == 4 and len(result["nope"]["steps_s"]) == 1 and "over the 0 s budget after 1 timed steps" in result["cut_short"]


def test_the_child_finds_what_a_relative_pythonpath_names(check_gpu, tmp_path, monkeypatch):
    """``PYTHONPATH=SITE:src`` with relative folders still reaches the pytest run, which starts in another folder."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "marker_module.py").write_text("")
    (tmp_path / "test_marker.py").write_text("def test_marker():\n    import marker_module  # noqa: F401\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["site", os.environ.get("PYTHONPATH", "")]))
    result = check_gpu.run_pytest([tmp_path / "test_marker.py"], tmp_path, budget=120)
    assert result["passed"], result["tail"]


def test_the_value_checks_child_takes_the_first_autotune_candidate(check_gpu, tmp_path, monkeypatch):
    """``--autotune first`` reaches the pytest child: its Triton autotuner is patched before any test imports a kernel,
    and the mode is in its environment; ``full`` leaves Triton as it is."""
    pytest.importorskip("triton")
    (tmp_path / "test_mode.py").write_text(
        "import os\n"
        "from triton.runtime import autotuner\n"
        "def test_mode():\n"
        "    patched = getattr(autotuner.Autotuner, '_srope_first', None) is not None\n"
        "    assert (os.environ['SROPE_AUTOTUNE'], patched) == (os.environ['EXPECTED_MODE'], os.environ['EXPECTED_MODE'] == 'first')\n")
    for mode in ("first", "full"):
        monkeypatch.setenv("EXPECTED_MODE", mode)
        result = check_gpu.run_pytest([tmp_path / "test_mode.py"], tmp_path, budget=120, tune=mode)
        assert result["passed"] and result["tests"]["PASSED"] == 1, (mode, result["tail"])
