"""Package attributes imported on first use, so that ``import srope`` and ``srope --help``
stay fast (PEP 562): torch and transformers load only when something needs them."""

from __future__ import annotations

import importlib
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: dict[str, str]):
    """``__getattr__`` and ``__dir__`` for ``package`` that import ``exports[name]`` (a module
    path) when ``name`` is first read, and keep it in the package's ``namespace``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


class MissingDependency(ImportError):
    """An optional package that this use of srope needs is not installed."""


def optional_import(module: str, *, extra: str, purpose: str):
    """``import module``, or a :class:`MissingDependency` that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = module.split(".")[0]
        raise MissingDependency(
            f"{purpose} needs the {package!r} package ({error}); install it with: pip install 'srope[{extra}]'"
        ) from error
