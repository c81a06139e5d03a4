"""What the ``srope`` command's parsers share: the output folder and argument types that
check their values (standard library only: ``srope --help`` stays instant)."""

from __future__ import annotations

import argparse

# Output of every command goes under ./out (git-ignored) unless --out says otherwise.
OUT = "out"


def _seed_list(text: str) -> list[int]:
    """``"0-4"`` or ``"0,3,7-9"`` as a list of distinct seeds (argparse type)."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            first, last = int(lo), int(hi) if dash else int(lo)
            if last < first:
                raise ValueError
            seeds.extend(range(first, last + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 0-4 or 0,3,7-9 (non-negative, ranges ascending), got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct, got {text!r}")
    return seeds


def _checked(convert, accept, expected: str):
    """An argparse type: ``convert(text)`` that ``accept`` s, else an error saying ``expected``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


_positive_int = _checked(int, lambda value: value >= 1, "a positive integer")
_fraction = _checked(float, lambda value: 0 < value < 1, "a number in (0, 1)")
