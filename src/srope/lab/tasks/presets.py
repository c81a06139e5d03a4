"""The synthetic tasks' presets as a run sees them: the task's module, its preset names, and a
run's settings, resolved from the preset < a ``--config`` file < ``--set`` overrides
(:func:`resolve_run`), with an older ``results.json``'s settings read as today's names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srope.lab.config import apply_config_file, apply_overrides, read_config_file
from srope.lab.tasks.registry import check_task
from srope.registry import model_presets

# What a run whose results.json predates a setting ran with, where that is not the setting's
# default today (cuda_graph's and head_at_targets' were "off" until they were checked and measured).
SETTINGS_BEFORE_THEY_EXISTED = {"cuda_graph": "off", "head_at_targets": "off"}
# Values a setting was once recorded as, and what they are called now.
RENAMED_VALUES = {"head_at_targets": {True: "on", False: "off"}}


def get_task(name: str):
    """The module of synthetic task ``name`` (:data:`srope.lab.tasks.registry.tasks`)."""
    return check_task(name).load()


def preset_names(task: str) -> list[str]:
    """The task's preset names, its default first."""
    return list(check_task(task).presets)


def presets_line(task: str) -> str:
    """One line naming the task's presets, for ``srope synth TASK --dry-run`` to print."""
    default, *others = preset_names(task)
    return f"presets for {task}: {default} (default){''.join(', ' + name for name in others)}; pick one with --preset NAME"


def resolve_preset(task: str, preset: str | None = None, overrides: dict[str, Any] | None = None, config: str | Path | None = None):
    """The task's preset with ``overrides`` applied and checked (:func:`resolve_run`)."""
    return resolve_run(task, preset, overrides, config)[1]


def resolve_run(task: str, preset: str | None = None, overrides: dict[str, Any] | None = None, config: str | Path | None = None) -> tuple[str, Any]:
    """The preset's name and the run's settings: the task's preset (``preset``, else the one
    the ``config`` file names, else the task's default) < the ``config`` file's settings
    (:func:`read_synth_config`) < ``overrides``, checked."""
    file_preset, settings = (None, {}) if config is None else read_synth_config(config, task)
    entry = check_task(task, preset or file_preset)
    name = preset or file_preset or entry.default_preset
    module = entry.load()
    cfg = module.PRESETS[name] if config is None else apply_config_file(module.PRESETS[name], settings, config)
    cfg = apply_overrides(cfg, overrides)
    module.check(cfg)
    if getattr(cfg, "threads", 0) < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's default), got {cfg.threads}")
    return name, cfg


def read_synth_config(path: str | Path, task: str) -> tuple[str | None, dict[str, Any]]:
    """The preset (None if it names none) and the settings of ``srope synth TASK --config FILE``:
    a sweep's ``results.json`` (its ``task``, ``preset`` and ``config``) or a JSON/TOML object of
    the task's settings, with ``task`` and ``preset`` optional. A file of another task or of
    ``srope train`` raises naming it."""
    values = read_config_file(path)
    if isinstance(values.get("config"), dict) and "runs" in values:  # a sweep's record
        values = {"task": values.get("task"), "preset": values.get("preset"), **recorded_settings(values["config"])}
    preset = values.pop("preset", None)
    if "task" not in values and isinstance(preset, str) and preset in model_presets:
        raise ValueError(f"--config {path}: a srope train config (preset {preset!r}), not srope synth's; give it to srope train --config")
    kind = values.pop("task", task)
    if kind != task:
        raise ValueError(f"--config {path}: a config of srope synth {kind}, not {task}")
    try:
        check_task(task, preset)
    except ValueError as error:
        raise ValueError(f"--config {path}: {error}") from None
    return preset, values


def recorded_settings(config: dict[str, Any]) -> dict[str, Any]:
    """A ``results.json`` config as today's settings: one added since ran as
    ``SETTINGS_BEFORE_THEY_EXISTED`` says, a value recorded under an older name has its new one."""
    config = {**SETTINGS_BEFORE_THEY_EXISTED, **config}
    config.update({key: names.get(config[key], config[key]) for key, names in RENAMED_VALUES.items() if key in config})
    return config
