"""The probe set of the per-epoch diagnostics: which validation examples, and the length bins they are read in.

Selection (``select_probe_indices``) depends only on the data, the seed and the settings, never on the
model: concat and add runs on the same data are compared on identical probes. With ``strata`` the probe
is stratified by length: the lengths are cut into intervals (e_{k-1}, e_k] (by default doubling ones, 8,
16, 32, ... up to the data's ``max_length``), each interval gets an equal share of the probe (a share an
interval cannot fill goes to the others), and inside an interval the examples are spread over its range of
lengths. Without strata the whole range is one interval (the draw ``analyze.py`` uses).

Length bins (``resolve_length_bins``) are cumulative, "up to" bins: the bin ``len_le_B`` holds every probe
example with at most B tokens (``<cls>`` included), so ``len_le_<max_length>`` is the whole probe. Bins are
given as token counts or as the symbols of ``LENGTH_BIN_SYMBOLS``, resolved per model and data.

A pass stops early on SIGTERM (``PassStopped``, ``sigterm_check``): Lightning only notes the signal and stops its
loops between batches, so a pass that ran to its end would hold the run's stop back by its whole length.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_LENGTH_BINS", "LENGTH_BIN_SYMBOLS", "PassStopped", "bin_key", "check_length_bins",
           "doubling_strata", "resolve_length_bins", "select_probe_indices", "sigterm_check",
           "sigterm_noted"]

# symbol -> what it stands for (docs/diagnostics.md, "Length bins")
LENGTH_BIN_SYMBOLS = {
    "dv+1": "min(d_v, d) + 1: every head is key-agnostically (stochastically) identifiable up to it",
    "2d+2": "2 * embed_dim + 2",
    "max/2": "the data's max_length // 2",
    "max": "the data's max_length",
}
DEFAULT_LENGTH_BINS = ("dv+1", "2d+2", "max/2", "max")


def check_length_bins(bins: Sequence[int | str] | None, name: str = "length_bins") -> list[int | str]:
    """The bins as a list, or ValueError naming the bad entry (each must be an int >= 1 or a symbol)."""
    out = []
    for b in list(bins or []):
        ok = isinstance(b, str) and b in LENGTH_BIN_SYMBOLS or isinstance(b, int) and not isinstance(b, bool) and b >= 1
        if not ok:
            raise ValueError(f"{name} entries must be token counts >= 1 or one of {list(LENGTH_BIN_SYMBOLS)}; "
                             f"got {b!r}")
        out.append(b)
    return out


def resolve_length_bins(bins: Sequence[int | str], *, embed_dim: int, head_stochastic: int,
                        max_length: int) -> list[int]:
    """Token counts of the bins, sorted and distinct; a bin above ``max_length`` becomes ``max_length``
    (it would hold the same examples), so ``2d+2`` = 130 on data of 128 tokens is the ``max`` bin."""
    values = {"dv+1": head_stochastic, "2d+2": 2 * embed_dim + 2, "max/2": max_length // 2, "max": max_length}
    resolved = {min(int(values[b]) if isinstance(b, str) else int(b), max_length) for b in check_length_bins(bins)}
    return sorted(v for v in resolved if v >= 1)


def bin_key(b: int) -> str:
    return f"len_le_{b}"


def bin_masks(lengths, bins: Sequence[int]) -> dict[int, torch.Tensor]:
    """{bin: (B,) bool, True for the examples of at most that many tokens} for every bin that holds one."""
    lengths = torch.as_tensor(lengths)
    masks = {b: lengths <= b for b in bins}
    return {b: m for b, m in masks.items() if bool(m.any())}


def doubling_strata(max_length: int, first: int = 8) -> list[int]:
    """Upper ends of the default strata: first, 2 first, 4 first, ... below max_length, then max_length."""
    edges, e = [], first
    while e < max_length:
        edges.append(e)
        e *= 2
    return [*edges, max_length]


def _spread(lengths: np.ndarray, eligible: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """``k`` of the ``eligible`` indices: targets evenly spaced over their range of lengths, each filled by a
    random unused example of the nearest available length (all of them when k >= their number)."""
    if k >= len(eligible):
        return [int(i) for i in eligible]
    if k <= 0:
        return []
    pools: dict[int, list[int]] = {}
    for i in rng.permutation(eligible):
        pools.setdefault(int(lengths[i]), []).append(int(i))
    chosen = []
    for t in np.linspace(lengths[eligible].min(), lengths[eligible].max(), k):
        best = min((n for n, v in pools.items() if v), key=lambda n: (abs(n - t), n))
        chosen.append(pools[best].pop())
    return chosen


def _quotas(available: Sequence[int], total: int) -> list[int]:
    """An equal share of ``total`` per stratum, round-robin from the longest; a share a stratum cannot fill
    (too few examples) goes to the others."""
    quota = [0] * len(available)
    left = min(total, sum(available))
    while left > 0:
        for k in reversed(range(len(available))):
            if left and quota[k] < available[k]:
                quota[k] += 1
                left -= 1
    return quota


def select_probe_indices(lengths, probe_size: int, seed: int = 0, max_length: int | None = None,
                         preferred=None, strata: Sequence[int] | None = None) -> list[int]:
    """Seeded, length-stratified probe of ``probe_size`` examples with 1 <= length <= ``max_length``.

    Without ``strata``: targets evenly spaced over the *range* of eligible lengths (not the data's length
    distribution), so probes sit both below and above the identifiable length even when most texts are
    short. With ``strata`` (increasing upper ends e_1 < e_2 < ...; lengths above the last are not eligible
    beyond ``max_length``): each interval (e_{k-1}, e_k] gets an equal share, spread over its range, and a
    share an interval cannot fill goes to the others. ``preferred`` (one bool per example, e.g. "has a
    rationale"): the probe is drawn from the preferred examples, and from the others only when too few are
    eligible; all True (or None) gives the plain draw. Returns indices sorted by (length, index).
    """
    lengths = np.asarray(lengths)
    cap = max_length or int(lengths.max(initial=0))
    if preferred is not None:
        pref = np.asarray(preferred, dtype=bool)
        # length 0: not eligible
        first = select_probe_indices(np.where(pref, lengths, 0), probe_size, seed, cap, strata=strata)
        rest = probe_size - len(first)
        more = select_probe_indices(np.where(pref, 0, lengths), rest, seed, cap, strata=strata) if rest > 0 else []
        return sorted(first + more, key=lambda i: (int(lengths[i]), i))
    eligible = np.flatnonzero((lengths >= 1) & (lengths <= cap))
    rng = np.random.default_rng(seed)
    if not strata:
        chosen = _spread(lengths, eligible, probe_size, rng)
    else:
        edges = sorted({min(int(e), cap) for e in strata} | {cap})
        lower = [0, *edges[:-1]]
        groups = [eligible[(lengths[eligible] > lo) & (lengths[eligible] <= hi)] for lo, hi in zip(lower, edges)]
        quota = _quotas([len(g) for g in groups], probe_size)
        chosen = [i for g, q in zip(groups, quota) for i in _spread(lengths, g, q, rng)]
    return sorted((int(i) for i in chosen), key=lambda i: (int(lengths[i]), i))


def nanmean(x: torch.Tensor) -> float:
    """Mean over the non-NaN entries (NaN when there are none)."""
    x = x.double()
    ok = ~torch.isnan(x)
    return float(x[ok].mean()) if bool(ok.any()) else math.nan


def first_examples(probe: dict[str, Any], k: int) -> dict[str, Any]:
    """The probe's first ``k`` examples (the shortest: it is sorted by length), their padding trimmed."""
    if k == len(probe["indices"]):
        return dict(probe)
    width = max(probe["lengths"][:k])
    batch = {key: v[:k, :width] if v.dim() == 2 else v[:k] for key, v in probe["batch"].items()}
    out = {**probe, "indices": probe["indices"][:k], "lengths": probe["lengths"][:k], "batch": batch,
           "tokens": None if probe["tokens"] is None else probe["tokens"][:k]}
    if probe.get("rationales") is not None:
        out["rationales"] = probe["rationales"][:k]
    return out


def scored_part(probe: dict[str, Any], model, max_length, length_bins: Sequence, key: str) -> dict[str, Any]:
    """The part of the shared probe a callback scores: its examples of at most ``max_length`` tokens (a number or a
    ``resolve_length_bins`` expression; None: all), with the length bins that fall within it. ``key`` names the
    callback (``callbacks.<key>.max_length``) in the message."""
    cap = probe["max_probe_length"]

    def resolve(bins):
        return resolve_length_bins(bins, embed_dim=model.embed_dim, max_length=cap,
                                   head_stochastic=probe["bounds"]["head_stochastic"])

    limit = cap if max_length is None else resolve([max_length])[0]
    k = sum(n <= limit for n in probe["lengths"])  # the probe is sorted by length: its first k
    if k == 0:
        raise ValueError(f"callbacks.{key}.max_length={max_length} (= {limit} tokens) leaves no probe example to "
                         f"score (the shortest has {probe['lengths'][0]} tokens): pass a larger one, or null for the "
                         "whole probe")
    if k < len(probe["lengths"]):
        log.info("%s: scoring the %d of %d probe examples with at most %d tokens (max_length=%s)",
                 key, k, len(probe["lengths"]), limit, max_length)
    return {**first_examples(probe, k), "length_bins": [b for b in resolve(length_bins) if b <= limit]}


class PassStopped(Exception):
    """SIGTERM arrived during a per-epoch diagnostic pass: the pass ends without logging or writing its numbers."""


def sigterm_check(trainer) -> Callable[..., None]:
    """A function that raises :class:`PassStopped` once SIGTERM has arrived, for a pass to call between its chunks.

    Inside ``trainer.fit`` Lightning's handler only sets ``trainer.received_sigterm`` (run/training.py's handler
    records it too) and the loops stop after the current batch; the validation's end, where the passes run, comes
    first. Stopped there, the pass lets the run save ``last.ckpt`` with the epoch's training and print its resume
    line at once. Ctrl-C needs no check: Python raises KeyboardInterrupt wherever the run is. The function takes
    and ignores one line, so that it also serves as the ``say`` of a faithfulness report (told at each explainer
    and each erasure window)."""

    def check(_line: str = "") -> None:
        if sigterm_noted(trainer):
            raise PassStopped

    return check


def sigterm_noted(trainer) -> bool:
    """Whether SIGTERM has arrived during this ``fit``/``validate``/``test`` (Lightning's ``received_sigterm``)."""
    return bool(getattr(trainer, "received_sigterm", False))


def forget_metrics(trainer, keys) -> None:
    """Drop ``keys`` (a stopped pass's, as its last complete pass logged them) from ``trainer.callback_metrics``:
    Lightning keeps an earlier epoch's values there, and the run's history and metrics.json would read them as
    this epoch's."""
    metrics = trainer.callback_metrics
    for key in keys or ():
        metrics.pop(key, None)


def stopped_by_sigterm(what: str, epoch: int, started: float) -> None:
    """Say that a pass stopped on SIGTERM and that its epoch has none of its numbers."""
    log.warning("%s of epoch %d stopped by SIGTERM after %.1f s: nothing logged or written for that epoch",
                what, epoch, time.perf_counter() - started)
