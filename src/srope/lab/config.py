"""The one base of the lab's run configurations and the one way to override them.

``srope train``'s :class:`~srope.lab.train.train_config.TrainConfig`, the synthetic tasks'
:class:`~srope.lab.tasks.common.TaskConfig` (every task preset extends it) and the demo's
:class:`~srope.lab.demo.DemoConfig` are dataclasses that extend :class:`RunConfig`; they
differ in their fields, not in how a field is set, checked or written out.

``--set KEY=VALUE`` (``srope train``, ``srope synth``) goes through :func:`apply_overrides`:
a field's value is converted to the type the field is annotated with; ``model.KEY`` and
``position.KEY`` set one entry of the model options and of the position encoding's options,
which each config class files where it keeps them (:meth:`RunConfig.nested_overrides`).

``--config FILE`` (``srope train``, ``srope synth``) goes through the same function: the
file's settings (:func:`read_config_file`: a JSON object, or TOML for a ``.toml`` name) are
applied to the preset's before the command's options and ``--set``
(:func:`apply_config_file`), so preset < file < options < ``--set``.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from srope.lab.overrides import coerce, parse_assignments, parse_literal

NESTED = ("model", "position")

C = TypeVar("C", bound="RunConfig")


class RunConfig:
    """Methods every run configuration shares (the subclasses are dataclasses)."""

    def check(self) -> None:
        """Raise ``ValueError`` naming the first bad value (the subclasses define what is)."""

    def to_dict(self) -> dict:
        """The configuration as plain JSON values (tuples as lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=list))

    def coerce_field(self, key: str, value: Any, annotation: Any) -> Any:
        """``value`` for the field ``key``, converted to its type."""
        return coerce(value, annotation, key)

    def nested_overrides(self, changes: dict[str, Any], model: dict[str, Any], position: dict[str, Any]) -> dict[str, Any]:
        """The field changes that file the ``model.KEY`` and ``position.KEY`` entries (values
        parsed as JSON literals), given the field ``changes`` made so far. By default the
        model entries go into the ``model`` dict; a config with position options says where
        they go."""
        out: dict[str, Any] = {}
        if model:
            out["model"] = {**changes.get("model", getattr(self, "model")), **model}
        if position:
            raise ValueError(f"{type(self).__name__} has no position options to set")
        return out


def apply_overrides(config: C, overrides: Mapping[str, Any] | list[str] | None) -> C:
    """A copy of ``config`` with ``overrides`` applied: ``{"lrs": "1e-3,5e-4"}`` or the command
    line's ``["lrs=1e-3,5e-4", ...]``. Values may be typed or strings; strings are converted to
    the field's type. An unknown key or a value of the wrong type raises ``ValueError`` naming
    what was expected; the caller checks the result (``config.check()`` or its own rules)."""
    pairs = parse_assignments(overrides) if isinstance(overrides, list) else dict(overrides or {})
    hints = typing.get_type_hints(type(config))
    names = [f.name for f in dataclasses.fields(config)]
    changes: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {head: {} for head in NESTED}
    for key, value in pairs.items():
        head, dot, rest = key.partition(".")
        if dot and rest and head in NESTED and head in names:
            nested[head][rest] = parse_literal(value) if isinstance(value, str) else value
        elif key in names:
            try:
                changes[key] = config.coerce_field(key, value, hints[key])
            except (TypeError, json.JSONDecodeError) as err:
                raise ValueError(f"--set {key}={value!r}: {err}") from None
        else:
            extra = "".join(f", {head}.KEY" for head in NESTED if head in names)
            raise ValueError(f"unknown setting {key!r} for {type(config).__name__}; valid: {', '.join(sorted(names))}{extra}")
    changes.update(config.nested_overrides(changes, nested["model"], nested["position"]))
    return dataclasses.replace(config, **changes)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings in ``path``: a JSON object, or a TOML document when the name ends in
    ``.toml``. A missing or unreadable file, or one that is not such an object, raises with
    one line naming it."""
    path, kind = Path(path), "TOML" if str(path).lower().endswith(".toml") else "JSON"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--config {path}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
    try:
        values = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"--config {path}: not valid {kind} ({error})") from None
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a {kind} object of settings, got {type(values).__name__}")
    return values


def apply_config_file(config: C, values: Mapping[str, Any], path: str | Path) -> C:
    """``config`` with the settings ``values`` read from ``path`` applied (:func:`apply_overrides`:
    typed values, an unknown key refused); an error names the file."""
    try:
        return apply_overrides(config, values)
    except ValueError as error:
        raise ValueError(f"--config {path}: {error}") from None
