"""Named, versioned runs of the paper's experiments: ``srope synth --recipe NAME[:ARM]``.

A recipe is a TOML file in this folder, ``NAME.toml``::

    version = 1                                  # raised whenever the run it names changes
    description = "one line: what the run is"
    task = "copying"
    preset = "release"
    [set]                                        # --set pairs, keys as on the command line
    eval_batch_size = 1000
    [arms.srope-gate-bias]                       # optional: the variants the experiment compares
    position_type = "selective_rope"
    "position.gate" = "per-channel"              # quoted, as in a --config file: one option

Keys read as in a ``--config`` TOML file: a quoted ``"model.KEY"`` is one entry, a table (or an
unquoted dotted key) the whole field. A recipe stands for a command line: ``srope synth --recipe
NAME:ARM ARGS`` runs what ``srope synth`` + :meth:`Recipe.flags` + ``ARGS`` runs, so the options
given with it go over its settings. A recipe with arms runs one arm at a time (``NAME:ARM``).

Standard library only: ``srope synth`` reads the recipes before torch loads.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from srope.lab.tasks.registry import check_task

NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
KEYS = ("version", "description", "task", "preset", "set", "arms")
OPTIONS = {"mixer": "--mixer", "position_type": "--position"}  # settings that srope synth also takes as options


@dataclass(frozen=True)
class Recipe:
    name: str  # NAME, or NAME:ARM
    version: int
    description: str
    task: str
    preset: str | None
    settings: dict[str, Any] = field(default_factory=dict)  # --set key -> value (as TOML typed it)

    def flags(self) -> list[str]:
        """The ``srope synth`` arguments this recipe stands for."""
        out = [self.task, *(["--preset", self.preset] if self.preset else [])]
        for key, value in self.settings.items():
            out += [OPTIONS[key], value] if key in OPTIONS else ["--set", f"{key}={as_text(value)}"]
        return out

    def record(self) -> dict[str, Any]:
        """What a sweep records of its recipe (``results.json``'s ``"recipe"``): name, arm (None without arms) and version."""
        name, _, arm = self.name.partition(":")
        return {"name": name, "arm": arm or None, "version": self.version}

    def folder(self) -> str:
        """The name of its run folder: ``NAME-ARM``."""
        return self.name.replace(":", "-")


def as_text(value: Any) -> str:
    """A TOML value as ``--set`` writes it: lists comma-separated, booleans lower case, tables as JSON."""
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(as_text(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def names() -> list[str]:
    """The recipe files' names, sorted."""
    return sorted(p.name[: -len(".toml")] for p in resources.files(__name__).iterdir() if p.name.endswith(".toml"))


def read(name: str) -> dict[str, Any]:
    """The checked contents of recipe ``name`` (no arm)."""
    if name not in names():
        raise ValueError(f"unknown recipe {name!r}; recipes: {', '.join(names())} (srope synth --list-recipes)")
    where = f"recipe {name} ({name}.toml)"
    try:
        data = tomllib.loads(resources.files(__name__).joinpath(f"{name}.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{where}: not valid TOML ({error})") from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; a recipe has {', '.join(KEYS)}")
    version, description = data.get("version"), data.get("description")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{where}: version must be a positive integer, got {version!r}")
    if not isinstance(description, str) or not description.strip() or "\n" in description:
        raise ValueError(f"{where}: description must be one line of text, got {description!r}")
    try:
        check_task(data.get("task"), data.get("preset"))
    except (ValueError, TypeError) as error:
        raise ValueError(f"{where}: {error}") from None
    if not isinstance(data.get("set", {}), dict):
        raise ValueError(f"{where}: [set] is a table of --set pairs")
    arms = data.get("arms", {})
    if not isinstance(arms, dict) or not all(isinstance(a, dict) and NAME.fullmatch(n) for n, a in arms.items()):
        raise ValueError(f"{where}: [arms.NAME] tables, names of lower-case letters, digits, '-' and '_'")
    return data


def load(spec: str) -> Recipe:
    """The run ``NAME`` or ``NAME:ARM`` names: the recipe's ``[set]`` with the arm's pairs over it."""
    name, _, arm = spec.partition(":")
    data = read(name)
    arms = data.get("arms", {})
    if arms and arm not in arms:
        given = f"has no arm {arm!r}" if arm else "compares arms"
        raise ValueError(f"recipe {name} {given}: run one of {', '.join(f'{name}:{a}' for a in arms)}")
    if arm and not arms:
        raise ValueError(f"recipe {name} has no arms: run it as {name}")
    settings = {**data.get("set", {}), **arms.get(arm, {})}
    return Recipe(spec, data["version"], data["description"], data["task"], data.get("preset"), settings)


def every() -> list[Recipe]:
    """Every run the recipes name: each arm of a recipe with arms, else the recipe."""
    return [load(f"{name}:{arm}" if arm else name) for name in names() for arm in (read(name).get("arms") or [""])]


def listing() -> str:
    """What ``srope synth --list-recipes`` prints: each recipe's name, version, description and arms."""
    lines = []
    for name in names():
        data = read(name)
        lines.append(f"{name} (version {data['version']}, {data['task']}): {data['description']}")
        if data.get("arms"):
            lines.append(f"  arms: {', '.join(f'{name}:{arm}' for arm in data['arms'])}")
    return "\n".join(lines)
