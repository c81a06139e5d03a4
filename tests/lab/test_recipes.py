"""The recipes (``srope synth --recipe NAME[:ARM]``): each runs what the command line it stands for
runs, resolved to the same settings; options given with it go over it; a bad name or file is one
line. Configuration only: nothing trains."""

from __future__ import annotations

import shlex

import pytest

from srope.lab import recipes
from srope.lab.cli import main
from srope.lab.tasks.cli import resolve_synth_command as resolved

# The runs experiments/gpu.sh made before its stages named recipes, as it wrote them: each recipe
# arm must resolve to the same settings (a run folder begun by one resumes under the other).
ENCODINGS = {"nope": "--position nope", "rope": "--position rope", "srope": "--position selective_rope",
             "srope-gate-bias": "--position selective_rope --set position.gate=per-channel --set position.bias=true"}  # fmt: skip
DEMO_ENCODING = ("--set position.projection=full-rank --set position.conv_size=1 --set position.gate=per-channel "
                 "--set position.max_temperature=3.141592653589793 --set position.projection_gain=8.0 --set position.phase_noise=0.1")  # fmt: skip
MAD_BASELINES = ",".join(f"{task}/baseline" for task in ("in-context-recall", "fuzzy-in-context-recall", "noisy-in-context-recall",
                                                          "selective-copying", "compression", "memorization"))  # fmt: skip
GPU_SH = {
    "st-attention-s2": ("state_tracking --preset paper --mixer attention --set model.num_hidden_layers=1 --set seeds=555 --set eval_size=16384",
                        ("nope", "rope", "srope")),
    "st-deltanet-a3": ("state_tracking --preset paper_a3 --set seeds=555 --set eval_size=16384", ("nope", "srope")),
    "st-gla-s2": ("state_tracking --preset authors --set seeds=0 --set eval_size=16384", ("nope", "rope", "srope")),
    "copying-fig5": ("copying --set seeds=0 --set eval_batch_size=1000", ("nope", "rope", "srope", "srope-gate-bias")),
    "mqar-fig6": ("mqar --set configs=512x64 --set d_models=64,128,256,512 --set lrs=0.0001,0.000464,0.00215,0.01 --set seeds=0,1,2 "
                  "--set head_at_targets=on", ("nope", "rope", "srope")),
    "mad-table1": (f"mad --set only={MAD_BASELINES}", ("nope", "rope", "srope", "srope-gate-bias")),
}
OLD_RUNS = {f"{name}:{arm}": f"{base} {ENCODINGS[arm]}" for name, (base, arms) in GPU_SH.items() for arm in arms}
OLD_RUNS["st-gla-s2:srope-demo-encoding"] = f"{GPU_SH['st-gla-s2'][0]} --position selective_rope {DEMO_ENCODING}"
# Fig. 5 as the release sweeps it: its four Selective RoPE arms (the gate per head, "standard").
RELEASE_ARMS = {f"copying-release-arms:{arm}": f"copying --preset release --set seeds=0,1,2 --set eval_batch_size=1000 {flags}" for arm, flags in {
    "nope": "--position nope", "rope": "--position rope", "srope": "--position selective_rope",
    "srope-bias": "--position selective_rope --set position.bias=true",
    "srope-gate": "--position selective_rope --set position.gate=standard",
    "srope-gate-bias": "--position selective_rope --set position.gate=standard --set position.bias=true"}.items()}  # fmt: skip
RELEASE_ARMS |= {f"st-release{kind}-tenth:{arm}": f"state_tracking --preset release{preset} --set epochs=10 --set seeds=0,1,2 --position {position}"
                 for kind, preset in (("", ""), ("-attention", "_attention"))
                 for arm, position in (("nope", "nope"), ("rope", "rope"), ("srope", "selective_rope"))}  # fmt: skip
RELEASE = {"mqar-release": "mqar --preset release", "copying-release": "copying --preset release",
           "st-release": "state_tracking --preset release", "st-release-attention": "state_tracking --preset release_attention"}  # fmt: skip


def test_every_recipe_has_a_version_a_line_of_description_and_runs_its_flags():
    runs = recipes.every()
    assert {r.name.partition(":")[0] for r in runs} == set(recipes.names()) and len(recipes.names()) >= 10
    for recipe in runs:
        assert recipe.version >= 1 and recipe.description.strip() and "\n" not in recipe.description
        assert resolved(["--recipe", recipe.name]) == resolved(recipe.flags()), recipe.name


@pytest.mark.parametrize("name", sorted({**OLD_RUNS, **RELEASE, **RELEASE_ARMS}))
def test_a_recipe_runs_what_its_command_line_ran(name):
    assert resolved(["--recipe", name]) == resolved(shlex.split({**OLD_RUNS, **RELEASE, **RELEASE_ARMS}[name])), name


def test_the_release_arms_gate_per_head():
    cfg = resolved(["--recipe", "copying-release-arms:srope-gate-bias"])[2]
    assert cfg.position["selective_rope"]["gate"] == "standard" and cfg.position["selective_rope"]["bias"] is True
    assert cfg.position["selective_rope"]["skip_conv"] is True and tuple(cfg.seeds) == (0, 1, 2)


def test_the_release_exact_presets_are_recipes():
    from srope.lab.tasks.registry import tasks

    release = {(entry.name, preset) for entry in tasks.values() for preset in getattr(entry.load(), "RELEASE_PRESETS", ())}
    assert release == {(r.task, r.preset) for r in recipes.every() if r.name in RELEASE}


def test_options_given_with_a_recipe_go_over_it():
    mine = ["--preset", "authors", "--set", "seeds=1,2", "--set", "position.gate=standard"]
    task, preset, cfg = resolved(["--recipe", "copying-fig5:srope-gate-bias", *mine])
    assert (task, preset, cfg) == resolved([*recipes.load("copying-fig5:srope-gate-bias").flags(), *mine])
    assert preset == "authors" and cfg.seeds == (1, 2) and cfg.eval_batch_size == 1000
    assert cfg.position["selective_rope"]["gate"] == "standard" and cfg.position["selective_rope"]["bias"] is True
    assert resolved(["--recipe", "copying-fig5:srope", "--position", "rope"])[2].position_type == "rope"


def test_a_recipe_runs_into_a_folder_of_its_name(tmp_path, monkeypatch):
    import srope.lab.tasks.runner as runner

    calls = []
    monkeypatch.setattr(runner, "run_synthetic", lambda task, factory, **kw: calls.append((task, kw)) or {"seconds": 0, "complete": True})
    monkeypatch.setattr(runner, "report", lambda dirs: "")
    monkeypatch.chdir(tmp_path)
    assert main(["synth", "--recipe", "st-gla-s2:srope-demo-encoding"]) == 0
    assert main(["synth", "--recipe", "mqar-fig6:nope", "--position", "rope"]) == 0
    (task, first), (_, second) = calls
    assert task == "state_tracking" and first["out"] == "out/synth/st-gla-s2-srope-demo-encoding" and first["preset"] == "authors"
    assert first["overrides"]["position.projection_gain"] == 8.0
    assert second["out"] == "out/synth/mqar-fig6-nope-rope" and second["overrides"]["position_type"] == "rope"
    # results.json records the recipe, so that a resume under another version is refused (tests/lab/tasks/test_resume.py)
    assert first["recipe"] == {"name": "st-gla-s2", "arm": "srope-demo-encoding", "version": recipes.load("st-gla-s2:srope").version}
    assert second["recipe"] == {"name": "mqar-fig6", "arm": "nope", "version": 1}
    assert recipes.load("copying-release").record() == {"name": "copying-release", "arm": None, "version": 1}


def test_list_recipes_names_each_with_its_version_and_arms(capsys):
    assert main(["synth", "--list-recipes"]) == 0
    out = capsys.readouterr().out
    assert "copying-fig5 (version 1, copying): Fig. 5" in out and "copying-fig5:srope-gate-bias" in out and "st-release-attention" in out
    assert main(["synth", "--recipe", "copying-fig5:nope", "--dry-run"]) == 0
    assert "recipe copying-fig5:nope (version 1): srope synth copying --preset release" in capsys.readouterr().out


@pytest.mark.parametrize("argv, expected", [
    (["--recipe", "copying-fig"], "unknown recipe 'copying-fig'; recipes: copying-fig5, "),
    (["--recipe", "copying-fig5"], "recipe copying-fig5 compares arms: run one of copying-fig5:nope, "),
    (["--recipe", "copying-fig5:gate"], "recipe copying-fig5 has no arm 'gate': run one of "),
    (["--recipe", "mqar-release:nope"], "recipe mqar-release has no arms: run it as mqar-release"),
    (["mqar", "--recipe", "copying-release"], "--recipe copying-release is a copying run, not mqar"),
    (["--recipe", "copying-release", "--preset", "zoology"], "unknown preset 'zoology' for copying"),
    ([], "give a task (mqar, mad, copying, state_tracking), --recipe NAME or --list-recipes"),
])  # fmt: skip
def test_a_bad_recipe_name_is_one_line(argv, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["synth", *argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"srope synth: error: {expected}") and "\n" not in err, err


@pytest.mark.parametrize("text, expected", [
    ('version = 1\ndescription = "d"\ntask = "copying"\nseeds = [0]', "unknown keys ['seeds']; a recipe has version, description"),
    ('version = 0\ndescription = "d"\ntask = "copying"', "version must be a positive integer, got 0"),
    ('version = 1\ndescription = """two\nlines"""\ntask = "copying"', "description must be one line of text"),
    ('version = 1\ndescription = "d"\ntask = "parity"', "unknown synthetic task 'parity'"),
    ('version = 1\ndescription = "d"\ntask = "copying"\n[arms.A]\nseeds = [0]', "[arms.NAME] tables, names of lower-case letters"),
    ('version = 1\ndescription = "d"\ntask = "copying"\nset = "seeds=0"', "[set] is a table of --set pairs"),
    ('version = = 1', "not valid TOML"),
])  # fmt: skip
def test_a_bad_recipe_file_is_refused_naming_it(text, expected, tmp_path, monkeypatch):
    (tmp_path / "mine.toml").write_text(text)
    monkeypatch.setattr(recipes.resources, "files", lambda package: tmp_path)
    with pytest.raises(ValueError) as error:
        recipes.load("mine")
    assert str(error.value).startswith(f"recipe mine (mine.toml): {expected}"), error.value


def test_values_read_as_the_command_line_writes_them():
    assert [recipes.as_text(v) for v in (True, [1e-4, 0.01], 3.141592653589793, "2-511", 7, {"a": 1})] == [
        "true", "0.0001,0.01", "3.141592653589793", "2-511", "7", '{"a": 1}']
