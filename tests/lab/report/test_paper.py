"""The paper's table: every entry names its figure or table, and the transcribed numbers agree
with the checks the digest reports (row averages, Avg-PPL = mean of the two perplexities)."""

from __future__ import annotations

import inspect
import re
import statistics

import pytest

from srope.lab.report import paper
from srope.lab.report.collect_lm import SELECTIVE_ROPE_DEFAULTS

SOURCE = re.compile(r"\bv[13] (Fig\.|Table) \d+")


@pytest.mark.parametrize("key", list(paper.EXPERIMENTS))
def test_every_entry_names_its_figure_or_table(key):
    exp = paper.EXPERIMENTS[key]
    assert SOURCE.search(exp.source), exp.source
    assert SOURCE.search(exp.protocol.source) or re.search(r"v3 (§|App\. )", exp.protocol.source), exp.protocol.source
    assert exp.protocol.budget > 0 and exp.protocol.budget_unit and exp.protocol.budget_source
    for claim in exp.claims:
        assert SOURCE.search(claim) or re.search(r"v3 §\d", claim), claim
    for value in exp.values:
        assert SOURCE.search(value.source), value
        if exp.numbers:
            assert isinstance(value.value, float), value
        else:  # a figure without numbers: no invented value, the claim instead
            assert value.value is None and value.claim, value
    if not exp.numbers:
        assert "only as a figure" in exp.note


def test_mad_averages_are_the_mean_of_the_six_tasks():
    for row, values in paper.mad_table1().items():
        tasks = [values[t] for t in paper.MAD_TASK_ORDER]
        assert abs(statistics.fmean(tasks) - values["average"]) < 0.051, row
    assert paper.MAD_SETTINGS == 66
    assert paper.MAD.protocol.budget == 6 * 200 * 573_536


def test_lm_averages_and_the_ablation_agree_with_table_3():
    for exp in paper.LM_TABLE3:
        for row in exp.rows():
            mean = statistics.fmean(exp.value(row, c).value for c in paper.ACCURACY_COLUMNS)
            printed = exp.value(row, "avg_acc").value
            # the digest: FoX's printed Avg sits about 0.85 below the mean (unresolved); GLA-1.3B NoPE prints 55.2 for 55.13
            tolerance = 0.9 if exp.key == "lm/fox-370m" else 0.08
            assert abs(mean - printed) < tolerance, (exp.key, row, mean, printed)
    gla = paper.EXPERIMENTS["lm/gla-370m"]
    for t3, t2 in (("NoPE", "NoPE"), ("RoPE", "RoPE"), ("Selective RoPE", "+ phase gate")):
        avg_ppl = (gla.value(t3, "wikitext_ppl").value + gla.value(t3, "lambada_ppl").value) / 2
        assert abs(avg_ppl - paper.LM_TABLE2.value(t2, "avg_ppl").value) < 0.006, t3
        assert gla.value(t3, "avg_acc").value == paper.LM_TABLE2.value(t2, "avg_acc").value


def test_selective_rope_defaults_match_the_module():
    from srope.modules import SelectiveRoPE

    signature = inspect.signature(SelectiveRoPE.__init__).parameters
    assert {name: signature[name].default for name in SELECTIVE_ROPE_DEFAULTS} == SELECTIVE_ROPE_DEFAULTS


def test_the_mad_page_keeps_table_1():
    from srope.lab.tasks import mad_report

    assert mad_report.PAPER_MAD_TABLE1 == paper.mad_table1()
    assert mad_report.PAPER_MAD_TABLE1["+ phase gate & bias"]["average"] == 73.2
