"""experiments/mqar_crossover.py: its command line, the variant parser and the per-seed summary
(the crossover itself needs the authors' checkout)."""

import numpy as np
import pytest


def test_variants_parse_into_kind_and_preset_overrides(experiment):
    parse = experiment("mqar_crossover").parse_variant
    assert parse("zoo") == ("zoo", {})
    assert parse("ours") == ("ours", {})
    assert parse("ours:cuda_graph=off") == ("ours", {"cuda_graph": "off"})
    assert parse("ours:cuda_graph=off,head_at_targets=on") == ("ours", {"cuda_graph": "off", "head_at_targets": "on"})
    for bad in ("theirs", "ours:cuda_graph", "ours:=off", "zoo:cuda_graph=off"):
        with pytest.raises(ValueError):
            parse(bad)


def test_command_line_of_the_gpu_run(experiment, tmp_path):
    module = experiment("mqar_crossover")
    args = module.parse_args(["--release", "rel", "--device", "cuda", "--train-examples", "100000", "--test-examples", "3000", "--seeds", "0,1,2",
                              "--variants", "zoo", "ours:cuda_graph=off", "ours", "--out", str(tmp_path)])  # fmt: skip
    assert args.seeds == [0, 1, 2] and args.variants == ["zoo", "ours:cuda_graph=off", "ours"]
    assert (args.train_examples, args.test_examples, args.device, args.fused_adamw) == (100000, 3000, "cuda", False)
    with pytest.raises(SystemExit):
        module.parse_args(["--release", "rel", "--variants", "zoo", "ours:graph", "--out", str(tmp_path)])


def test_summary_finds_the_first_steps_above_each_threshold_and_bitwise_equal_pairs(experiment):
    module = experiment("mqar_crossover")
    zoo = list(np.linspace(9.0, 1.0, 392))
    near = [v + (0.0 if i < 2 else 2e-3 if i < 9 else 2e-2) for i, v in enumerate(zoo)]
    rows = [{"variant": "zoo", "losses": zoo}, {"variant": "ours:cuda_graph=off", "losses": near}, {"variant": "ours", "losses": list(near)}]
    lines = module.summary_lines(rows)
    assert any("@50:" in line and "@392:" in line for line in lines if line.strip().startswith("zoo"))
    versus = [line for line in lines if "vs zoo" in line]
    assert len(versus) == 2 and all("first step >1e-3: 3, >1e-2: 10" in line for line in versus)
    assert "  ours:cuda_graph=off and ours: losses bitwise equal" in lines
    assert "  zoo and ours: losses bitwise different" in lines
    assert module.first_above(np.zeros(4), 1e-3) is None


def test_zoology_parameter_names_map_onto_ours(experiment):
    to_ours = experiment("mqar_crossover").zoology_to_ours
    assert to_ours("backbone.embeddings.word_embeddings.weight") == "model.embeddings.weight"
    assert to_ours("backbone.layers.1.sequence_mixer.mixer.g_norm_swish_gate.weight") == "model.layers.1.mixer.g_norm.norm.weight"
    assert to_ours("backbone.layers.0.sequence_mixer.mixer.conv.conv.weight") == "model.layers.0.mixer.conv.weight"
