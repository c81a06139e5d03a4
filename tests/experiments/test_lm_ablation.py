"""experiments/lm_ablation.py: the order of its steps and the options of its arms (dry run)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "lm_ablation.py"



def test_dry_run_orders_sweep_seeds_and_evals(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--data", "corpus", "--out", str(tmp_path), "--dry-run", "--jobs", "1",
                          "--arms", "srope_baseline", "--seeds", "1-2", "--lrs", "1e-3,2e-3"], capture_output=True, text=True, check=True).stdout
    commands = [line for line in out.splitlines() if " -m srope " in line]
    kinds = [line.split(" -m srope ")[1].split()[0] for line in commands]
    assert kinds[0] == "sweep-lr" and sorted(kinds[1:]) == ["eval", "eval", "train", "train"]
    assert kinds.index("eval") > kinds.index("train")
    sweep = commands[0]
    assert "--lrs 1e-3,2e-3" in sweep and "--set seed=0" in sweep and "--set position.gate=none" in sweep
    assert "--set position.conv_activation=none" in sweep and "--set model.num_hidden_layers=4" in sweep
    trains = [c for c in commands if " -m srope train " in c]
    assert {c.split("--set seed=")[1].split()[0] for c in trains} == {"1", "2"}
    assert all("--set checkpoint_every=200" in c for c in [sweep, *trains])  # one checkpoint per run, at its end
    assert not (tmp_path / "ablation.json").exists()  # a dry run writes nothing


def test_arms_and_seeds(experiment):
    module = experiment("lm_ablation")
    assert module.parse_seeds("1-4") == [1, 2, 3, 4] and module.parse_seeds("0,3-4") == [0, 3, 4]
    assert set(module.ARMS) >= {"nope", "rope", "selective_rope", "srope_baseline", "srope_silu"}
    assert all("model.gate_logit_normalizer=1e6" in module.ARMS[a] for a in module.ARMS if a.endswith("decay_off"))


def test_unknown_arm_is_an_error(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--data", "d", "--out", str(tmp_path), "--arms", "nope,alibi", "--dry-run"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "unknown arms ['alibi']" in result.stderr


def test_chosen_lr_needs_a_choice(tmp_path, experiment):
    module = experiment("lm_ablation")
    (tmp_path / "sweep.json").write_text('{"chosen": null}')
    with pytest.raises(RuntimeError, match="chose no learning rate"):
        module.chosen_lr(tmp_path)
    (tmp_path / "sweep.json").write_text('{"chosen": {"lr": 0.002, "dir": "lr_0.002"}}')
    assert module.chosen_lr(tmp_path) == 0.002


def test_finished_runs_lose_their_checkpoints_unless_kept(tmp_path, experiment):
    module = experiment("lm_ablation")
    runs = [tmp_path / name for name in ("lr_0.001", "seed1")]
    for run in runs:
        (run / "checkpoints" / "step_200").mkdir(parents=True)
        (run / "model").mkdir()
    args = module.argparse.Namespace(keep_checkpoints=True, dry_run=False, jobs=1, out=str(tmp_path))
    module.Plan(args).drop_checkpoints(*runs)
    assert all((run / "checkpoints").is_dir() for run in runs)
    args.keep_checkpoints = False
    module.Plan(args).drop_checkpoints(*runs)
    assert not any((run / "checkpoints").exists() for run in runs) and all((run / "model").is_dir() for run in runs)


def test_a_recorded_sweep_is_not_run_again(tmp_path, experiment):
    module = experiment("lm_ablation")
    assert not module.sweep_done(tmp_path, "1e-3,2e-3")
    runs = [{"lr": 0.001, "status": "ok"}, {"lr": 0.002, "status": "ok"}]
    (tmp_path / "sweep.json").write_text(module.json.dumps({"runs": runs, "chosen": runs[0]}))
    assert module.sweep_done(tmp_path, "1e-3,2e-3")
    assert not module.sweep_done(tmp_path, "5e-4,1e-3,2e-3")  # a learning rate not yet tried
    (tmp_path / "sweep.json").write_text(module.json.dumps({"runs": runs, "chosen": None}))
    assert not module.sweep_done(tmp_path, "1e-3,2e-3")
