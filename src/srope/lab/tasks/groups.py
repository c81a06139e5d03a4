"""Finite permutation groups for the word problems: elements, multiplication table, checks.

An element is a permutation of ``range(n)`` as a tuple ``p`` with ``p[i]`` the image of
``i``. The product ``a · b`` means "apply ``a``, then ``b``": ``(a · b)[i] = b[a[i]]``. The
state after reading ``x_1 … x_t`` is ``x_1 · x_2 · … · x_t`` (the identity before any input).

Groups by name (n <= 6): ``S{n}`` (symmetric, n! elements), ``A{n}`` (alternating, the even
permutations, n!/2) and ``Z{n}`` (cyclic, the rotations of ``range(n)``). ``S2`` is parity:
its table is XOR. Index 0 is always the identity.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from functools import cache

import numpy as np

Perm = tuple[int, ...]


def compose(a: Perm, b: Perm) -> Perm:
    """``a · b``: apply ``a`` first, then ``b``."""
    return tuple(b[a[i]] for i in range(len(a)))


def is_even(p: Perm) -> bool:
    inversions = sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j])
    return inversions % 2 == 0


@dataclass(frozen=True)
class Group:
    name: str
    degree: int  # permutations of range(degree)
    elements: tuple[Perm, ...]
    table: np.ndarray  # [order, order] int: table[i, j] = index of elements[i] · elements[j]

    @property
    def order(self) -> int:
        return len(self.elements)


def _elements(kind: str, n: int) -> list[Perm]:
    identity = tuple(range(n))
    if kind == "S":
        return list(itertools.permutations(identity))  # lexicographic: the identity first
    if kind == "A":
        return [p for p in itertools.permutations(identity) if is_even(p)]
    if kind == "Z":
        return [tuple((i + shift) % n for i in range(n)) for shift in range(n)]
    raise ValueError(f"unknown group family {kind!r}")


def expected_order(kind: str, n: int) -> int:
    return {"S": math.factorial(n), "A": math.factorial(n) // 2 if n > 1 else 1, "Z": n}[kind]


@cache
def get_group(name: str) -> Group:
    """The group ``name`` (``"S2"``, ``"A3"``, ``"S3"``, ``"S5"``, ``"Z4"``, ...), verified."""
    match = re.fullmatch(r"([SAZ])(\d+)", str(name))
    if not match:
        raise ValueError(f"group must look like S<n>, A<n> or Z<n> (e.g. S2, A3, S5), got {name!r}")
    kind, n = match.group(1), int(match.group(2))
    if not 1 <= n <= 6:
        raise ValueError(f"group degree must be in [1, 6] (S6 has 720 elements), got {n}")
    elements = _elements(kind, n)
    index = {p: i for i, p in enumerate(elements)}
    table = np.empty((len(elements), len(elements)), dtype=np.int64)
    for i, a in enumerate(elements):
        for j, b in enumerate(elements):
            product = compose(a, b)
            if product not in index:
                raise AssertionError(f"{name} is not closed: {a} · {b} = {product}")
            table[i, j] = index[product]
    group = Group(name=name, degree=n, elements=tuple(elements), table=table)
    verify_group(group, expected_order(kind, n))
    return group


def verify_group(group: Group, order: int | None = None) -> None:
    """Check the group axioms on the table (raises AssertionError naming the failure).

    Closure (entries are element indices), identity at index 0, inverses (every row and
    column holds the identity exactly once, at mirrored places), associativity over all
    triples, and the group order.
    """
    t, n = group.table, group.order
    if order is not None and n != order:
        raise AssertionError(f"{group.name} has {n} elements, expected {order}")
    if t.shape != (n, n) or t.min() < 0 or t.max() >= n:
        raise AssertionError(f"{group.name}: table is not closed")
    if group.elements[0] != tuple(range(group.degree)):
        raise AssertionError(f"{group.name}: element 0 is not the identity")
    if not (np.array_equal(t[0], np.arange(n)) and np.array_equal(t[:, 0], np.arange(n))):
        raise AssertionError(f"{group.name}: element 0 does not act as the identity")
    rows, cols = np.nonzero(t == 0)
    if len(rows) != n or len(set(rows.tolist())) != n:
        raise AssertionError(f"{group.name}: some element has no unique right inverse")
    inverse = np.empty(n, dtype=np.int64)
    inverse[rows] = cols
    if not np.array_equal(t[inverse, np.arange(n)], np.zeros(n, dtype=np.int64)):
        raise AssertionError(f"{group.name}: left and right inverses differ")
    for a in range(n):  # associativity, one row of triples at a time: (a·b)·c == a·(b·c)
        if not np.array_equal(t[t[a]], t[a][t]):
            raise AssertionError(f"{group.name}: not associative at a={a}")


def prefix_products(group: Group, words: np.ndarray) -> np.ndarray:
    """``[N, L]`` element indices -> ``[N, L]`` states ``x_1 · … · x_t`` after each prefix."""
    columns = np.ascontiguousarray(np.asarray(words).T)  # time-major: one contiguous row per step
    dtype = np.result_type(columns.dtype, np.min_scalar_type(group.order - 1))
    flat = group.table.ravel()
    states = np.empty(columns.shape, dtype=dtype)
    state = np.zeros(columns.shape[1], dtype=np.int64)
    for t in range(columns.shape[0]):
        state = flat[state * group.order + columns[t]]
        states[t] = state
    return np.ascontiguousarray(states.T)
