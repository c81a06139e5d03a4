"""Provenance records and stale-result detection (srope.lab.provenance) in this checkout."""

from __future__ import annotations

import pytest

from srope.lab import provenance


def _git(*args):
    out = provenance._git(*args)
    if out is None:
        pytest.skip("not a git checkout with history")
    return out


def test_record_names_commit_command_and_versions(monkeypatch):
    monkeypatch.delenv("SROPE_COMMIT", raising=False)
    record = provenance.record(["srope", "train", "--preset", "gla-tiny"], seeds=[1, 2], wall_s=3.5)
    assert record["command"] == "srope train --preset gla-tiny" and record["seeds"] == [1, 2] and record["wall_s"] == 3.5
    assert {"python", "torch"} <= set(record["versions"]) and record["date"]
    head = provenance._git("rev-parse", "HEAD")
    assert record["commit"] == head
    monkeypatch.setattr(provenance, "ROOT", provenance.ROOT / "no-such-checkout")  # a copy without .git
    monkeypatch.setenv("SROPE_COMMIT", "abc1234")
    assert provenance.commit() == ("abc1234", None)
    assert provenance.is_stale("abc1234") is None  # cannot tell outside a checkout


def test_the_commit_named_by_whoever_copied_the_tree_wins(monkeypatch):
    # A device copy can carry an older .git than its files: the name given with it is the truth.
    monkeypatch.setenv("SROPE_COMMIT", "f" * 40)
    assert provenance.commit() == ("f" * 40, None)
    assert provenance.record(["srope"])["commit"] == "f" * 40


def test_stale_when_the_model_code_changed_after_the_result():
    newest = _git("log", "-1", "--format=%H", "--", *provenance.MODEL_CODE)
    assert provenance.last_change() == newest
    assert provenance.is_stale(newest) is False
    assert provenance.is_stale(_git("rev-parse", "HEAD")) is False
    before = provenance._git("rev-parse", f"{newest}~1")
    if before is None:
        pytest.skip("the model code's last change is the first commit")
    assert provenance.is_stale(before) is True
    assert provenance.is_stale(None) is True and provenance.is_stale("0" * 40) is True
    assert provenance.subject(newest) == _git("log", "-1", "--format=%B", newest).splitlines()[0] != ""  # the message's first line


def test_a_run_records_the_commit_it_started_with(monkeypatch):
    """A commit made while a run ran is not the code it ran: record() takes the commit read
    when the run began (srope train and srope demo pass it)."""
    monkeypatch.setenv("SROPE_COMMIT", "a" * 40)
    began = provenance.commit()
    monkeypatch.setenv("SROPE_COMMIT", "b" * 40)  # as if HEAD moved during the run
    assert provenance.record(["srope"], source=began)["commit"] == "a" * 40
    assert provenance.record(["srope"])["commit"] == "b" * 40
