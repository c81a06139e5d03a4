"""benchmarks/check_repeat.py names the module whose output stops repeating, and the
gradients that differ, when one part of the step changes between repeats."""

from __future__ import annotations

import json
import sys

import torch

from tests.benchmarks.conftest import as_from_the_command_line


def test_names_the_module_that_does_not_repeat(monkeypatch, tmp_path, run_benchmark):
    as_from_the_command_line(monkeypatch)
    import check_repeat

    build = check_repeat.srope_model_factory
    calls = {"n": 0}

    def drifting_head(request):  # the head's output is scaled a little differently in every repeat
        model = build(request)

        def drift(_module, _inputs, output):
            calls["n"] += 1
            return output * (1 + 1e-3 * calls["n"])

        model.lm_head.register_forward_hook(drift)
        return model

    monkeypatch.setattr(check_repeat, "srope_model_factory", drifting_head)
    out = tmp_path / "check.json"
    monkeypatch.setattr(sys, "argv", ["check_repeat.py", "--only", "st-gla-s2-nope", "--batch", "4", "--repeats", "3",
                                      "--device", "cpu", "--out", str(out)])
    check_repeat.main()
    result = json.loads(out.read_text())["configs"]["st-gla-s2-nope"]
    assert result["batch"] == [4, 129]
    for repeat in result["repeats"]:
        assert repeat["first_output_that_differs"] == "lm_head"
        assert repeat["outputs_that_differ"] == ["lm_head"]  # the body before it repeats bitwise
        assert repeat["first_output_grad_that_differs"] == "lm_head"
        assert "lm_head.weight" in repeat["grads_that_differ"] and "model.embeddings.weight" in repeat["grads_that_differ"]
        assert repeat["largest_grad_difference"] > 0
        assert not repeat["loss_equal"]


def test_a_cpu_step_repeats_bitwise(tmp_path, run_benchmark):
    out = tmp_path / "check.json"
    run_benchmark("check_repeat", "--only", "st-gla-s2-srope-demo-encoding", "--batch", "4", "--repeats", "2", "--device", "cpu",
                  "--out", str(out))
    result = json.loads(out.read_text())["configs"]["st-gla-s2-srope-demo-encoding"]
    (repeat,) = result["repeats"]
    assert repeat["loss_equal"] and repeat["first_output_that_differs"] is None and repeat["grads_that_differ"] == []
    assert len(set(result["losses"])) == 1 and torch.isfinite(torch.tensor(result["losses"])).all()
