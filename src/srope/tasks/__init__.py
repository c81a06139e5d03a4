"""The paper's synthetic tasks: generators, metrics, presets and one runner.

Tasks (one module each): ``mqar`` (Zoology's multi-query associative recall), ``mad`` (the
six MAD tasks and their 66 settings), ``copying`` (string copying with length
extrapolation) and ``state_tracking`` (group word problems: S2 parity, A3, S3, S5).

``run_synthetic(task, model_factory, out=..., overrides=...)`` trains and evaluates one model
configuration with the task's protocol; ``report(dirs)`` compares result folders.
"""

from srope.tasks.common import ModelRequest, apply_overrides, default_cache_dir, parse_lengths, parse_overrides
from srope.tasks.runner import TASKS, get_task, report, resolve_preset, run_synthetic

__all__ = [
    "TASKS", "ModelRequest", "apply_overrides", "default_cache_dir", "get_task", "parse_lengths", "parse_overrides", "report",
    "resolve_preset", "run_synthetic",
]
