"""experiments/vs_authors.py: the statistics both pipelines' data are compared by, the Hydra
scalar parser, the loss binning and the summary's verdict (the pipelines themselves need the
authors' checkout and a GPU)."""

import json

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
