"""The synthetic tasks by name: :data:`tasks`, which ``srope synth``, the runner and the report read.

Standard library only, so that ``srope synth`` refuses a misspelt task or preset before torch
loads. A task registers its name, its module (an import string, or the module or object
itself) and its preset names, the default first; the module holds the presets
(``PRESETS``: name -> config, the same names) and the task's functions (``check``,
``settings``, ``prepare``: docs/extending.md). A task may also name the module of its page in
``srope report`` (``report``: :meth:`TaskEntry.report_module`), which holds what the report
knows of the task: the page and its figure, the verdict rule and its thresholds, when a test
is valid, how a run's records become the report's, and its table of result folders::

    register_task("mytask", module="mypkg.mytask", presets=("paper", "cpu"), report="mypkg.mytask_report")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from srope.registry import Registry, load


@dataclass(frozen=True)
class TaskEntry:
    name: str
    module: Any
    presets: tuple[str, ...]  # the default first
    report: Any = None  # the module (or an import string of it) whose report_page(rows) builds the task's page of ``srope report``

    @property
    def default_preset(self) -> str:
        return self.presets[0]

    def load(self) -> Any:
        """The task's module (imported on first use), checked to define the registered presets."""
        module = load(self.module)
        defined = tuple(getattr(module, "PRESETS", {}))
        if sorted(defined) != sorted(self.presets):
            raise ValueError(f"task {self.name!r} registers the presets {self.presets}, but its module defines {defined}")
        return module

    def report_module(self) -> Any:
        """The module of the task's page in ``srope report`` (imported on first use): its
        ``report_page(rows)`` builds the page; optional: ``report_plot(rows)`` the figure,
        ``RULE`` the verdict rule listed in the index, ``MIN_STEPS_SHARE`` and ``VALIDITY``
        when a test is valid, ``folder_table(results_list)`` the table of result folders
        (docs/extending.md). None when the task has no page."""
        return None if self.report is None else load(self.report)


tasks: Registry[TaskEntry] = Registry("synthetic task")


def register_task(name: str, *, module: Any, presets: tuple[str, ...], report: Any = None, replace: bool = False) -> TaskEntry:
    if not presets:
        raise ValueError(f"task {name!r} needs at least one preset (its default first)")
    return tasks.register(name, TaskEntry(name, module, tuple(presets), report), replace=replace)


def check_task(name: str, preset: str | None = None) -> TaskEntry:
    """The entry of task ``name``; a ValueError naming the choices for an unknown task or preset."""
    if name not in tasks:
        raise ValueError(f"unknown synthetic task {name!r}; choose one of {', '.join(tasks)}")
    entry = tasks[name]
    if preset is not None and preset not in entry.presets:
        raise ValueError(f"unknown preset {preset!r} for {name}; choose one of {', '.join(entry.presets)}")
    return entry


register_task("mqar", module="srope.lab.tasks.mqar", presets=("release", "zoology", "paper", "cpu"), report="srope.lab.tasks.mqar_report")
register_task("mad", module="srope.lab.tasks.mad", presets=("paper", "cpu"), report="srope.lab.tasks.mad_report")
register_task("copying", module="srope.lab.tasks.copying", presets=("release", "authors", "paper", "cpu"), report="srope.lab.tasks.copying_report")
register_task("state_tracking", module="srope.lab.tasks.state_tracking", presets=("release", "release_attention", "authors", "paper", "paper_a3", "cpu"),
              report="srope.lab.tasks.state_tracking_report")
