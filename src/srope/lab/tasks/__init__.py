"""The paper's synthetic tasks: generators, metrics, presets and one runner.

Tasks (one module each, registered by name in :mod:`srope.lab.tasks.registry`): ``mqar``
(Zoology's multi-query associative recall), ``mad`` (the six MAD tasks and their 66 settings),
``copying`` (string copying with length extrapolation) and ``state_tracking`` (group word
problems: S2 parity, A3, S3, S5).

``run_synthetic(task, model_factory, out=..., overrides=...)`` trains and evaluates one model
configuration with the task's protocol; ``report(dirs)`` tabulates result folders, one row each
(what ``srope synth`` prints; ``srope report`` compares experiments).
Attributes import their module on first use (``srope --help`` stays fast).
"""

from srope._lazy import lazy_exports

_EXPORTS = {
    **{name: "srope.lab.tasks.common" for name in ("ModelRequest", "default_cache_dir", "parse_lengths")},
    **{name: "srope.lab.tasks.runner" for name in ("get_task", "report", "resolve_preset", "run_synthetic")},
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = sorted(_EXPORTS)
