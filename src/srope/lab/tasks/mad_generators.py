"""The MAD tasks' data generators (:mod:`srope.lab.tasks.mad` has the tasks, settings and
protocol). Each takes a seeded ``numpy.random.Generator`` and returns ``(inputs, targets)``
arrays ``[count, length]``; ``IGNORE`` targets get no loss and no metric.

Deviations from MAD-Lab's generators (same distributions otherwise, new random streams):
the recall tasks' forced non-noise pair is drawn among the pairs before the probe (MAD's can
land on the probe, leaving no presented key to probe); the fuzzy task's probe insertion
point is drawn so that the probe pair is always inserted (MAD's can fall after the loop
ends, so the final probe may ask an unseen key); selective copying draws its blank positions
from the seeded generator (MAD uses numpy's global random state there).
"""

from __future__ import annotations

import numpy as np

from srope.lab.tasks.common import IGNORE


def _first_occurrence(ids: np.ndarray) -> np.ndarray:
    """For ``[N, P]`` ids, the column of each entry's first occurrence in its row."""
    n, p = ids.shape
    order = np.argsort(ids, axis=1, kind="stable")
    sorted_ids = np.take_along_axis(ids, order, axis=1)
    starts = np.ones_like(sorted_ids, dtype=bool)
    starts[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(p)[None, :], 0), axis=1)
    first_sorted = np.take_along_axis(order, run_start, axis=1)
    first = np.empty_like(order)
    np.put_along_axis(first, order, first_sorted, axis=1)
    return first


def in_context_recall(rng: np.random.Generator, count: int, vocab_size: int, seq_len: int, multi_query: bool = True,
                      noise_vocab_size: int = 0, frac_noise: float = 0.0, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's (noisy) in-context recall; ``seq_len - 1`` tokens per example (MAD's shift)."""
    if seq_len % 2 or seq_len < 4:
        raise ValueError(f"seq_len must be even and >= 4, got {seq_len}")
    if not 0.0 <= frac_noise < 1.0 or (frac_noise > 0 and noise_vocab_size < 1):
        raise ValueError("need 0 <= frac_noise < 1 and noise_vocab_size >= 1 when frac_noise > 0")
    symbols = (vocab_size if multi_query else vocab_size - 1) - noise_vocab_size
    n_keys = symbols // 2
    if n_keys < 1:
        raise ValueError(f"vocab_size {vocab_size} leaves no keys after {noise_vocab_size} noise tokens")
    body = seq_len // 2 - 1  # pairs before the final probe
    rows = np.arange(count)[:, None]
    noise = rng.random((count, body)) < frac_noise if frac_noise > 0 else np.zeros((count, body), dtype=bool)
    noise[np.arange(count), rng.integers(0, body, size=count)] = False  # at least one real pair
    keys = rng.integers(0, n_keys, size=(count, body))
    fresh = rng.integers(n_keys, symbols, size=(count, body))
    key_ids = np.where(noise, n_keys, keys)  # noise pairs share a dummy id
    first = _first_occurrence(key_ids)
    values = fresh[rows, first]  # a key keeps the value drawn at its first occurrence
    repeated = (first < np.arange(body)[None, :]) & ~noise
    seq = np.empty((count, 2 * body), dtype=np.int64)
    if frac_noise > 0:
        noise_tokens = rng.integers(symbols, symbols + noise_vocab_size, size=(count, body, 2))
        seq[:, 0::2] = np.where(noise, noise_tokens[..., 0], keys)
        seq[:, 1::2] = np.where(noise, noise_tokens[..., 1], values)
    else:
        seq[:, 0::2], seq[:, 1::2] = keys, values
    tgt = np.full_like(seq, IGNORE)
    if multi_query:
        tgt[:, 1::2] = np.where(repeated, values, IGNORE)
    presented = np.zeros((count, n_keys + 1), dtype=bool)
    presented[rows, key_ids] = True
    probe = np.argmax(rng.random((count, n_keys)) * presented[:, :n_keys], axis=1)  # uniform over presented keys
    probe_value = values[np.arange(count), np.argmax(key_ids == probe[:, None], axis=1)]
    tail = [probe, probe_value] if multi_query else [np.full(count, vocab_size - 1), probe, probe_value]
    tail_tgt = [np.full(count, IGNORE), probe_value] if multi_query else [np.full(count, IGNORE), np.full(count, IGNORE), probe_value]
    full = np.concatenate([seq, np.stack(tail, 1)], axis=1)
    full_tgt = np.concatenate([tgt, np.stack(tail_tgt, 1)], axis=1)
    return (full[:, :-1], full[:, 1:]) if training else (full[:, :-1], full_tgt[:, 1:])


def _fuzzy_one(rng, vocab_size, seq_len, k_motif_size, v_motif_size, multi_query, training):
    pad = vocab_size - 1 if multi_query else vocab_size - 2
    symbols = vocab_size - 1 if multi_query else vocab_size - 2
    n_keys = symbols // 2
    longest = k_motif_size + v_motif_size
    # Every random choice is drawn up front (one row per loop iteration; an iteration adds
    # at least 2 tokens): motif sizes, and motifs as prefixes of random permutations, i.e.
    # uniform ordered motifs of distinct tokens.
    draws = seq_len // 2 + 1
    k_sizes = rng.integers(1, k_motif_size + 1, size=draws).tolist() if training else [k_motif_size] * draws
    v_sizes = rng.integers(1, v_motif_size + 1, size=draws).tolist()
    k_motifs = np.argsort(rng.random((draws, n_keys)), axis=1)[:, :k_motif_size].tolist()
    v_motifs = (n_keys + np.argsort(rng.random((draws, symbols - n_keys)), axis=1)[:, :v_motif_size]).tolist()

    k_probe, v_probe = tuple(k_motifs[0][: k_sizes[0]]), tuple(v_motifs[0][: v_sizes[0]])
    probe_len = len(k_probe) + len(v_probe)
    limit = seq_len - probe_len - longest
    probe_at = int(rng.integers(0, limit - longest + 1))  # always reached by the loop below
    inputs: list[int] = []
    targets: list[int] = []
    value_of: dict[tuple, tuple] = {}
    seen: set[tuple] = set()
    added = False
    i = 0
    while len(inputs) < limit:
        i += 1
        if len(inputs) >= probe_at and not added:
            inputs += [*k_probe, *v_probe]
            targets += [IGNORE] * probe_len
            value_of[k_probe] = v_probe
            seen.add(k_probe)
            added = True
            continue
        key = tuple(k_motifs[i][: k_sizes[i]])
        if key == k_probe:
            value, added = v_probe, True
        elif key in value_of:
            value = value_of[key]
        else:
            value = value_of[key] = tuple(v_motifs[i][: v_sizes[i]])
        inputs += [*key, *value]
        targets += [IGNORE] * len(key) + (list(value) if key in seen and multi_query else [IGNORE] * len(value))
        seen.add(key)
    head = [] if multi_query else [vocab_size - 1]
    inputs += [*head, *k_probe, *v_probe]
    targets += [IGNORE] * (len(head) + len(k_probe)) + list(v_probe)
    n_pad = seq_len + 1 - len(inputs)
    inputs, targets = [pad] * n_pad + inputs, [IGNORE] * n_pad + targets
    return inputs, targets


def fuzzy_in_context_recall(rng: np.random.Generator, count: int, vocab_size: int, seq_len: int, k_motif_size: int = 3, v_motif_size: int = 3,
                            multi_query: bool = True, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's fuzzy in-context recall; ``seq_len`` tokens per example."""
    symbols = vocab_size - 1 if multi_query else vocab_size - 2
    if symbols // 2 < k_motif_size or symbols - symbols // 2 < v_motif_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for key/value motifs of {k_motif_size}/{v_motif_size} distinct tokens")
    if seq_len < 4 * (k_motif_size + v_motif_size):
        raise ValueError(f"seq_len must be >= {4 * (k_motif_size + v_motif_size)} for motifs of {k_motif_size}+{v_motif_size}, got {seq_len}")
    rows = [_fuzzy_one(rng, vocab_size, seq_len, k_motif_size, v_motif_size, multi_query, training) for _ in range(count)]
    full = np.asarray([r[0] for r in rows], dtype=np.int64)
    full_tgt = np.asarray([r[1] for r in rows], dtype=np.int64)
    return (full[:, :-1], full[:, 1:]) if training else (full[:, :-1], full_tgt[:, 1:])


def selective_copying(rng: np.random.Generator, count: int, vocab_size: int, seq_len: int, num_tokens_to_copy: int, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's selective copying; ``seq_len`` tokens. ``training`` is unused (same targets)."""
    n = num_tokens_to_copy
    blanks = seq_len - 2 * n - 1
    if blanks < 1 or vocab_size < 3:
        raise ValueError(f"selective copying needs seq_len > 2*num_tokens_to_copy + 1 and vocab_size >= 3, got {seq_len}, {n}, {vocab_size}")
    blank, copy = vocab_size - 2, vocab_size - 1
    tokens = rng.integers(0, vocab_size - 2, size=(count, n))
    # MAD inserts each blank before a uniformly chosen token (index in [0, n)), so no blank
    # ever follows the last token: count the blanks before each token.
    where = rng.integers(0, n, size=(count, blanks)) + n * np.arange(count)[:, None]
    before = np.bincount(where.ravel(), minlength=count * n).reshape(count, n)
    positions = np.arange(n)[None, :] + np.cumsum(before, axis=1)
    first = np.full((count, n + blanks), blank, dtype=np.int64)
    np.put_along_axis(first, positions, tokens, axis=1)
    inputs = np.concatenate([first, np.full((count, 1), copy), np.full((count, n), blank)], axis=1)
    targets = np.concatenate([np.full((count, n + blanks + 1), IGNORE), tokens], axis=1)
    return inputs, targets


def compression(rng: np.random.Generator, count: int, vocab_size: int, seq_len: int, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's compression: random tokens then the compression token; targets = inputs."""
    inputs = np.concatenate([rng.integers(0, vocab_size - 1, size=(count, seq_len - 1)), np.full((count, 1), vocab_size - 1)], axis=1)
    return inputs, inputs.copy()


def memorization(rng: np.random.Generator, count: int, vocab_size: int, seq_len: int, kv_map: np.ndarray, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's memorisation: pairs ``key, insert`` with the map's value as target at ``insert``."""
    keys = rng.integers(0, len(kv_map), size=(count, seq_len // 2))
    inputs = np.empty((count, 2 * keys.shape[1]), dtype=np.int64)
    inputs[:, 0::2], inputs[:, 1::2] = keys, vocab_size - 1
    targets = np.full_like(inputs, IGNORE)
    targets[:, 1::2] = kv_map[keys]
    return inputs, targets
