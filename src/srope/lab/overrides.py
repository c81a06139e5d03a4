"""``--set KEY=VALUE``: a value (often a command-line string) converted to, and checked
against, the type a config field is annotated with, before anything runs."""

from __future__ import annotations

import json
import types
import typing
from typing import Any


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """``["lrs=1e-3,5e-4", "seeds=0"]`` (the command line's ``--set``, repeated) into a dict;
    a malformed item raises."""
    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {text!r}")


def parse_literal(text: str) -> Any:
    """A JSON literal when ``text`` is one (numbers, true/false/null, lists, objects), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        low = text.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null"):
            return None
        return text


def coerce(value: Any, annotation: Any, key: str) -> Any:
    """``value`` as the annotated type (``int``, ``float``, ``bool``, ``str``, ``dict``,
    ``list``/``tuple`` of those, optional ones; anything else passes as it is); a value that is not one raises
    ``ValueError`` naming ``key`` and the type expected."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None or isinstance(value, str) and value.strip().lower() in ("none", "null"):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], key)
    if origin in (tuple, list):
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else [v for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            value = [value]
        elem = args[0] if args else str
        if origin is tuple and len(args) == 2 and args[1] is not Ellipsis:  # fixed pair, e.g. betas
            if len(value) != 2:
                raise ValueError(f"--set {key}: expected 2 values, got {list(value)}")
            return tuple(coerce(v, a, key) for v, a in zip(value, args))
        items = [coerce(v, elem, key) for v in value]
        return tuple(items) if origin is tuple else items
    if annotation is bool:
        return value if isinstance(value, bool) else parse_bool(str(value))
    if annotation is int:
        try:
            number = float(value) if isinstance(value, str) else value
        except ValueError:
            raise ValueError(f"--set {key}: expected an integer, got {value!r}") from None
        if isinstance(number, bool) or not isinstance(number, (int, float)) or isinstance(number, float) and not number.is_integer():
            raise ValueError(f"--set {key}: expected an integer, got {value!r}")
        return int(number)
    if annotation is float:
        if isinstance(value, bool):
            raise ValueError(f"--set {key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"--set {key}: expected a number, got {value!r}") from None
    if annotation is str:
        return str(value)
    if annotation is dict or origin is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(f"--set {key}: expected a JSON object, got {value!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"--set {key}: expected a JSON object, got {value!r}")
        return dict(value)
    return value
