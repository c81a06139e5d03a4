"""experiments/vs_authors.py: the statistics both pipelines' data are compared by, the Hydra
scalar parser, the loss binning and the summary's verdict (the pipelines themselves need the
authors' checkout and a GPU)."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from srope.lab.tasks import copying, mqar
from srope.lab.tasks.common import IGNORE
from srope.lab.tasks.runner import resolve_preset


def test_parse_scalar_reads_values_as_hydra_overrides_do(experiment):
    parse = experiment("vs_authors").parse_scalar
    assert parse("2e-3") == 2e-3 and parse(" 5000") == 5000 and parse("true") is True and parse("False") is False
    assert parse("null") is None and parse(" rfa ") == "rfa"


def test_bin_curve_means_full_windows_only(experiment):
    points = [(step, float(step)) for step in range(1, 26)]
    assert experiment("vs_authors").bin_curve(points, 10) == [[10, 5.5], [20, 15.5]]


def test_mqar_stats_of_our_generator_match_its_construction(experiment):
    cfg = resolve_preset("mqar", "cpu", {})
    inputs, targets = mqar.generate(512, 64, 4, 300, np.random.default_rng(0), power_a=cfg.power_a)
    stats = experiment("vs_authors").mqar_stats(inputs, targets)
    assert stats["rows"] == 300 and stats["queries_per_row"] == 4.0
    assert 1 <= stats["key_range"][0] and stats["key_range"][1] < 256 <= stats["value_range"][0] and stats["value_range"][1] < 512
    assert 0 < stats["distance_median"] <= stats["distance_p90"] < 64


def test_copying_stats_count_examples_and_answer_tokens(experiment):
    rng = np.random.default_rng(0)
    rows = [copying.packed_row(rng, 420, 2, 64, 26) for _ in range(64)]
    tokens = np.stack([t for t, _ in rows])
    mask = np.stack([m for _, m in rows])
    stats = experiment("vs_authors").copying_stats(tokens[:, 1:], mask[:, 1:], copying.EOS)
    # an example of length L scores its L answer tokens and its "."
    assert stats["answer_tokens_per_example"] == pytest.approx(34.5, abs=3)
    assert stats["examples_per_row"] * stats["answer_tokens_per_example"] == pytest.approx(stats["scored_per_row"])
    assert IGNORE not in tokens


def test_summary_says_whether_the_gap_is_within_the_seed_spread(experiment, tmp_path):
    module = experiment("vs_authors")

    def write(pipeline, seed, losses):
        run = {"task": "mqar", "pipeline": pipeline, "seed": seed, "loss_curve": [[10 * (i + 1), v] for i, v in enumerate(losses)],
               "seconds": 1.0, "data": {}, "device": "cpu", "eval": [{"accuracy": 0.5}]}
        (tmp_path / f"mqar-{pipeline}-{seed}.json").write_text(json.dumps(run))

    for pipeline, finals in (("authors", [2.0, 2.2, 2.4]), ("ours", [2.1, 2.3, 2.6])):
        for seed, final in enumerate(finals):
            write(pipeline, seed, [9.0] * 20 + [final] * 5)
    summary = module.summarise(tmp_path)["mqar"]
    assert summary["equal_within_spread"] and summary["gap"] == pytest.approx(0.1333, abs=1e-3)
    for seed in range(3):
        write("ours", seed, [9.0] * 20 + [5.0] * 5)
    assert not module.summarise(tmp_path)["mqar"]["equal_within_spread"]


# ---- state tracking: the data bridge's pure helpers, our side on a tiny protocol, and (where a
# checkout of the release is at SROPE_AUTHORS_RELEASE) the release's own reading of our files


def test_release_csv_is_generate_data_format(experiment, tmp_path):
    from srope.lab.tasks import state_tracking
    from srope.lab.tasks.groups import get_group

    words = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0], [1, 1, 0, 1, 0, 0]], dtype=np.uint8)
    x, y = state_tracking.tag_words(get_group("S2"), words)
    experiment("vs_authors").write_release_csv(tmp_path / "S2=6.csv", x, y, 7)
    # rows as synthetic_tasks/state_tracking/generate_data.py wrote them for S2 (k=6, --seed 7)
    # in a CPU trial: polars' header and separators, states after each prefix, no BOS
    assert (tmp_path / "S2=6.csv").read_text() == "seed,input,target\n7,0 0 0 0 0 0,0 0 0 0 0 0\n7,0 0 0 0 1 0,0 0 0 0 1 1\n7,1 1 0 1 0 0,1 0 0 1 1 1\n"


def test_release_ids_move_only_bos(experiment):
    ids = experiment("vs_authors").release_ids(np.array([[2, 0, 1, 1], [2, 1, 0, 1]]), order=2)
    assert ids.tolist() == [[3, 0, 1, 1], [3, 1, 0, 1]] and ids.dtype == np.int64
    with pytest.raises(ValueError, match="0, 2"):
        experiment("vs_authors").release_ids(np.array([[3, 0]]), order=2)


def test_token_digest_sees_every_token_and_the_dtype_not(experiment):
    digest = experiment("vs_authors").token_digest
    x = np.random.default_rng(0).integers(0, 2, size=(2000, 9))
    y = np.cumsum(x, axis=1) % 2
    base = digest(x, y)
    assert base == digest(x.astype(np.uint8), y.astype(np.int16)) and base["rows"] == 2000 and base["first_rows"] == 1024
    changed = x.copy()
    changed[1500, 3] ^= 1
    later = digest(changed, y)
    assert later["sha256"] != base["sha256"] and later["first_sha256"] == base["first_sha256"]


def test_csv_polars_gives_the_vocabulary_call_its_result(experiment, tmp_path):
    pl = experiment("vs_authors").CsvPolars
    (tmp_path / "S3=3.csv").write_text("seed,input,target\n1,0 4 5,0 4 1\n1,2 2 0,2 3 3\n")
    tokens = pl.read_csv(tmp_path / "S3=3.csv").select(pl.col("input").map_batches(lambda x: x.str.split(" "))).explode("input").unique()["input"].to_list()
    assert sorted(tokens, key=int) == ["0", "2", "4", "5"] and len(tokens) == 4


def test_state_tracking_stats(experiment):
    x = np.array([[3, 0, 1, 1], [3, 0, 1, 1], [3, 1, 1, 0]])
    y = np.array([[3, 0, 1, 0], [3, 0, 1, 0], [3, 1, 0, 0]])
    stats = experiment("vs_authors").state_tracking_stats(x, y)
    assert stats == {"rows": 3, "length": 3, "identity_inputs": pytest.approx(3 / 9), "identity_states": pytest.approx(6 / 9), "distinct_rows": 2}


def test_state_tracking_protocol_plans_the_steps_it_runs(experiment):
    module = experiment("vs_authors")
    p = module.PROTOCOL["state_tracking"]
    overrides, cfg = module.our_state_tracking(2)
    # ours plans epochs x ceil(train_size / batch_size) steps; the release's CosineAnnealingLR
    # T_max is epochs x len(train_dataloader) over the same rows and batch size; no stop rule
    assert cfg.train_size == p["steps_per_epoch"] * cfg.batch_size and cfg.epochs * p["steps_per_epoch"] == 300
    assert cfg.stop_at is None and cfg.schedule == "cosine" and cfg.max_steps is None and cfg.seeds == (2,) and cfg.lrs == (5e-4,)
    assert (cfg.group, cfg.train_len, cfg.eval_len, cfg.batch_size, cfg.data_seed) == ("S2", 128, 512, 1024, 0)
    assert cfg.position_type == "selective_rope" and cfg.position["selective_rope"]["bias"] and cfg.position["selective_rope"]["gate"] is None
    assert cfg.model["use_short_conv"] and cfg.position["selective_rope"]["spectrum"] == "uniform"


def test_our_state_tracking_side_records_data_curve_and_evaluations(experiment, tmp_path, monkeypatch):
    module = experiment("vs_authors")
    tiny = {"train_len": 8, "eval_len": 16, "train_size": 256, "eval_size": 32, "batch_size": 64, "eval_batch_size": 32, "epochs": 2,
            "model.hidden_size": 32, "model.num_heads": 2, "loss_every": 2}
    monkeypatch.setitem(module.PROTOCOL, "state_tracking", {**module.PROTOCOL["state_tracking"], "ours_extra": tiny})
    out = {}
    module.run_ours_state_tracking(0, out, tmp_path / "ours")
    assert out["steps"] == out["planned_steps"] == 8 and [s for s, _ in out["loss_curve"]] == [2, 4, 6, 8]
    assert [h["step"] for h in out["eval"]["history"]] == [4, 8] and 0 <= out["eval"]["final"]["seq_acc"] <= 1
    train = out["data"]["train"]
    assert train["rows"] == 256 and train["length"] == 8 and train["distinct_rows"] == 256 and len(train["sha256"]) == 64
    run = {"task": "state_tracking", "pipeline": "ours", **out}
    assert set(module.final_score(run)) == {"seq_acc_final", "seq_acc_best", "seq_acc_train_len_final"}


def test_summary_compares_the_state_tracking_digests(experiment, tmp_path):
    module = experiment("vs_authors")
    for pipeline, digest in (("authors", "a"), ("ours", "a")):
        run = {"task": "state_tracking", "pipeline": pipeline, "seed": 0, "loss_curve": [[10, 0.7]], "seconds": 1.0, "device": "cpu",
               "data": {"train": {"sha256": digest}, "eval": {"sha256": "b"}},
               "eval": [{"sequence_accuracy": 0.5, "sequence_accuracy_at_train_len": 0.9}] if pipeline == "authors" else
               {"final": {"seq_acc": 0.4, "seq_acc_at_train_len": 0.8}, "best": {"seq_acc": 0.4}}}
        (tmp_path / f"state_tracking-{pipeline}-0.json").write_text(json.dumps(run))
    summary = module.summarise(tmp_path)["state_tracking"]
    assert summary["same_data"] and summary["authors"]["scores"][0]["seq_acc_final"] == 0.5


RELEASE = Path(os.environ.get("SROPE_AUTHORS_RELEASE", "")).expanduser()  # a checkout of the authors' release, outside this tree
needs_release = pytest.mark.skipif(not os.environ.get("SROPE_AUTHORS_RELEASE") or not (RELEASE / "synthetic_tasks" / "state_tracking").is_dir(),
                                   reason="set SROPE_AUTHORS_RELEASE to a checkout of timurcarstensen/selective-rope")


@needs_release
def test_composed_state_tracking_config_is_the_released_sweep_point(experiment, tmp_path):
    pytest.importorskip("omegaconf", reason="the release's configurations are OmegaConf files")
    from omegaconf import OmegaConf

    cfg, changes = experiment("vs_authors").authors_state_tracking_config(RELEASE, 1, tmp_path, 4)
    pe = cfg.model.position_embedding
    assert (pe.type, pe.temp_type, pe.temp_theta, pe.temp_max, pe.use_gate, pe.use_bias, pe.phi_proj_rank) == ("selective_rope", "rope", 1.0, 1.0, False, True, 32)
    assert cfg.model.use_short_conv and cfg.model.model_type == "gla" and cfg.trainer.lr == 5e-4 and cfg.data.group == "S2"
    assert changes == {"trainer.seed": 1, "trainer.epochs": 3, "trainer.max_val_acc": None, "trainer.logging": False, "trainer.num_workers": 4,
                       "data.data_dir": str(tmp_path)}
    hydra = pytest.importorskip("hydra", reason="Hydra's own composition to compare with")
    root = RELEASE / "configs" / "state_tracking"
    sweep = OmegaConf.load(root / "state_tracking.yaml").hydra.sweeper.params
    picks = [f"{key}={str(text).split(',')[0].strip()}" for key, text in sweep.items() if key != "trainer.seed"]
    with hydra.initialize_config_dir(config_dir=str(root), version_base=None):
        composed = hydra.compose("state_tracking", overrides=["model/position_embedding=selective_rope", "trainer.seed=1", *picks])
    composed = OmegaConf.create({k: v for k, v in OmegaConf.to_container(composed).items() if k != "cluster"})  # the Slurm script
    for key, value in changes.items():
        OmegaConf.update(composed, key, value)
    assert OmegaConf.to_container(composed) == OmegaConf.to_container(cfg)


@needs_release
def test_release_get_dataset_reads_our_csv_as_our_ids(experiment, tmp_path, monkeypatch):
    for name in ("fla", "einops", "accelerate", "datasets", "omegaconf"):
        pytest.importorskip(name, reason="the release's state_tracking.main imports it (fla via selective_rope)")
    from accelerate import Accelerator

    from srope.lab.tasks import state_tracking
    from srope.lab.tasks.groups import get_group

    module = experiment("vs_authors")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    main = module.import_state_tracking_main(RELEASE)
    Accelerator(cpu=True)  # the release logs through accelerate's logger, which needs its state
    x, y = state_tracking.make_split(get_group("S2"), 12, 200, np.random.default_rng(3))
    module.write_release_csv(tmp_path / "S2=12.csv", x, y, 0)
    built, _ = module.release_get_dataset(main.get_dataset, main.PreTrainedTokenizerFast, group="S2", k=12, strict_len=True, train_size=1.0, data_dir=tmp_path, supervised=True)
    inputs, labels = module.dataset_arrays(built["dataset"])
    assert built["n_vocab"] == 9 and built["tokenizer"].bos_token_id == 3
    assert module.token_digest(inputs, labels) == module.token_digest(module.release_ids(x, 2), module.release_ids(y, 2))
