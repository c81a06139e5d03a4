"""Text sources (srope.lab.train.corpus), offline: how a plain text is cut into documents, how
JSON lines are read, and which ``--data`` values are local paths and which go to the Hub."""

from __future__ import annotations

import random
import time

import pytest

from srope.lab.train.corpus import TextSource, resolve_source, split_text
from tests.lab.train.conftest import make_text


def _split_text_before(text: str, chunk_chars: int) -> list[str]:
    """split_text as it was before it was made linear (it sliced the rest of a long paragraph
    after every chunk): the reference the new one must equal."""
    from srope.lab.train.corpus import _BLANK_LINE

    pieces, start = [], 0
    for blank in _BLANK_LINE.finditer(text):
        pieces.append(text[start : blank.end()])
        start = blank.end()
    pieces.append(text[start:])
    documents, current = [], ""
    for piece in pieces:
        while len(piece) > chunk_chars:
            cut = piece.rfind("\n", 0, chunk_chars)
            cut = cut if cut > 0 else piece.rfind(" ", 0, chunk_chars)
            cut = cut + 1 if cut > 0 else chunk_chars
            documents += [current, piece[:cut]] if current else [piece[:cut]]
            current, piece = "", piece[cut:]
        current += piece
        if len(current) >= chunk_chars:
            documents.append(current)
            current = ""
    documents.append(current)
    return [document.strip() for document in documents if document.strip()]


@pytest.mark.parametrize("seed", range(40))
def test_split_text_equals_the_quadratic_original_on_small_inputs(seed):
    rng = random.Random(seed)
    alphabet = ["a", "bb", " ", "  ", "\n", "\n\n", " \n \n", "\t", "xyz" * rng.randint(1, 30)]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 600))) if seed % 2 else make_text(rng, rng.randint(0, 400))
    for chunk in (1, 2, 7, 50, 333, 2000):
        assert split_text(text, chunk) == _split_text_before(text, chunk), (seed, chunk)


def test_split_text_is_linear_on_a_long_text_without_blank_lines():
    """A text of many MB without one blank line (one paragraph) took time quadratic in its
    length: every chunk copied the rest of the paragraph (32 MB: 20 s; 20 MB here: ~4 s)."""
    rng = random.Random(0)
    line = " ".join(rng.choice(["word", "longer", "x", "text"]) for _ in range(30)) + "\n"
    text = line * (20_000_000 // len(line))  # ~20 MB, no blank line
    began = time.perf_counter()
    documents = split_text(text)
    seconds = time.perf_counter() - began
    assert seconds < 1.0, seconds
    assert all(len(d) <= 2000 for d in documents) and "".join(d + "\n" for d in documents) == text
    assert split_text("y" * 30_000, 2000) == ["y" * 2000] * 15  # no line end and no space: cut every 2000 characters


def test_only_hf_names_go_to_the_hub(tmp_path, monkeypatch):
    """``hf:NAME`` is a Hub dataset; anything else is a local path, and a missing one is an error
    at once (``data/nope.txt`` was taken for the Hub dataset ``data/nope.txt``: 25 s of retries)."""
    monkeypatch.chdir(tmp_path)
    hub = resolve_source("hf:HuggingFaceFW/fineweb-edu:sample-10BT", text_field="content")
    assert (hub.kind, hub.path, hub.config, hub.text_field) == ("hf", "HuggingFaceFW/fineweb-edu", "sample-10BT", "content")
    began = time.perf_counter()
    with pytest.raises(ValueError, match=r"data source 'data/nope\.txt': no such file or folder"):
        resolve_source("data/nope.txt")
    with pytest.raises(ValueError, match=r"no such file or folder.*did you mean hf:HuggingFaceFW/fineweb-edu:sample-10BT\?"):
        resolve_source("HuggingFaceFW/fineweb-edu:sample-10BT")
    assert time.perf_counter() - began < 1.0
    (tmp_path / "owner" / "name").mkdir(parents=True)
    (tmp_path / "owner" / "name" / "a.txt").write_text("local text", encoding="utf-8")
    assert resolve_source("owner/name") == TextSource("files", "owner/name")  # a local folder of that shape is local


@pytest.mark.parametrize("row, got", [("null", "null"), ("5", "a number"), ('["a"]', "an array"), ("true", "a boolean")])
def test_a_json_lines_row_whose_text_is_not_a_string_names_the_file_and_line(tmp_path, row, got):
    lines = tmp_path / "docs.jsonl"
    lines.write_text('{"text": "first document"}\n\n{"text": "second"}\n{"text": %s}\n{"text": "after"}\n' % row, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"docs\.jsonl, line 4: field 'text' must be a string, got {got}"):
        list(resolve_source(lines).documents())


def test_json_lines_errors_name_the_line_and_the_cli_says_it_in_one_line(tmp_path, tokenizer_dir, capsys):
    from srope.lab.cli import main

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n{"text": "cut off\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.jsonl, line 2: not valid JSON"):
        list(resolve_source(broken).documents())
    rows = tmp_path / "rows.json"  # a .json file may hold an array of objects
    rows.write_text('[{"text": "one"}, {"text": "two"}, "three"]', encoding="utf-8")
    with pytest.raises(ValueError, match=r"rows\.json, item 3: expected a JSON object with a 'text' field, got a string"):
        list(resolve_source(rows).documents())
    nulls = tmp_path / "nulls.jsonl"
    nulls.write_text('{"text": "one two"}\n{"text": null}\n', encoding="utf-8")
    assert main(["data", "prepare", str(nulls), "--tokenizer", str(tokenizer_dir), "--cache", str(tmp_path / "c")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "nulls.jsonl, line 2: field 'text' must be a string, got null" in err[0], err


def test_json_lines_are_read_in_order_without_datasets(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # JSON lines need no optional package
    lines = tmp_path / "docs.jsonl"
    lines.write_text('{"text": "one", "id": 1}\n\n{"text": "two"}\n', encoding="utf-8")
    array = tmp_path / "more.json"
    array.write_text('[{"text": "three"}, {"text": "four"}]', encoding="utf-8")
    assert [d.text for d in resolve_source(tmp_path).documents()] == ["one", "two", "three", "four"]


def test_a_local_dataset_folder_with_a_loading_script_is_refused(tmp_path, tokenizer_dir, capsys, no_network):
    """srope never runs a dataset's code: a folder holding a loading script is refused as a
    local source and as ``hf:PATH`` (where ``datasets`` raised a RuntimeError traceback)."""
    from srope.lab.cli import main

    folder = tmp_path / "myds"
    folder.mkdir()
    (folder / "myds.py").write_text("import datasets\n", encoding="utf-8")
    (folder / "data.jsonl").write_text('{"text": "one"}\n', encoding="utf-8")
    for spec in (str(folder), f"hf:{folder}"):
        with pytest.raises(ValueError, match=r"myds\.py.*loading script.*never runs"):
            resolve_source(spec)
    assert main(["data", "prepare", f"hf:{folder}", "--tokenizer", str(tokenizer_dir), "--cache", str(tmp_path / "c")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "loading script" in err[0], err
