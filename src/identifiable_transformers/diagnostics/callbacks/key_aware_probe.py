"""The key-aware count on a few long probe sentences (docs/identifiability.md 2.5, docs/diagnostics.md).

The identifiability probe (callback.py) stops at about 2 d + 2 tokens, where the key-agnostic
null space is decided. The key's role matters at the data's real lengths, so this probe takes a
handful of validation examples whose lengths span up to ``max_length`` (targets max_length,
max_length / 4, max_length / 16, ...; an example longer than its target is cut to it) and counts,
per head, the alternatives the head itself could produce (``key_aware_alternative_dims``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..maths.key_aware_heads import key_aware_alternative_dims

PREFIX = "val/ident"


def key_aware_targets(k: int, max_length: int, min_length: int = 8) -> list[int]:
    """``k`` target lengths, max_length / 4^j (at least min_length), longest first, distinct."""
    targets: list[int] = []
    for j in range(k):
        t = max(min_length, int(round(max_length / 4**j)))
        if t not in targets:
            targets.append(t)
    return targets


def pick_examples(lengths: Sequence[int], targets: Sequence[int], seed: int = 0,
                  longest_whole: bool = False) -> list[tuple[int, int]]:
    """(index, n) per target n: a seeded example at least n tokens long, not picked before, cut to n.

    A target that no remaining example reaches is left out (the report), or with ``longest_whole`` takes the
    longest remaining example whole (the callback, which wants its examples however short the data is).
    """
    lengths = np.asarray(lengths)
    rng = np.random.default_rng(seed)
    used: set[int] = set()
    chosen = []
    for target in targets:
        pool = [int(i) for i in np.flatnonzero(lengths >= target) if int(i) not in used]
        if pool:
            i, n = int(rng.choice(pool)), int(target)
        elif longest_whole:
            rest = [int(i) for i in np.argsort(-lengths, kind="stable") if int(i) not in used]
            if not rest:
                break
            i, n = rest[0], int(lengths[rest[0]])
        else:
            continue
        chosen.append((i, n))
        used.add(i)
    return chosen


def select_key_aware_examples(lengths: Sequence[int], k: int, max_length: int, seed: int = 0) -> list[tuple[int, int]]:
    """The callback's examples: ``pick_examples`` over ``key_aware_targets(k, max_length)``, longest whole."""
    return pick_examples(lengths, key_aware_targets(k, max_length), seed, longest_whole=True)


def key_aware_batch(rows: Sequence[dict[str, Any]], cut: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask of the rows' first ``cut[i]`` tokens."""
    width = max(cut)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for r, (row, n) in enumerate(zip(rows, cut)):
        ids[r, :n] = torch.as_tensor(row["input_ids"][:n])
    mask = torch.arange(width)[None] < torch.as_tensor(list(cut))[:, None]
    return {"input_ids": ids, "attention_mask": mask}


def _per_example(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                 check: Callable[[], None]) -> dict[str, Any]:
    """``key_aware_alternative_dims`` one example at a time (at the batch's width, as on the whole batch), with
    ``check`` before each: every count is per example, so the merged result is the whole batch's."""
    parts = []
    for b in range(len(ids)):
        check()
        parts.append(key_aware_alternative_dims(model, ids[b : b + 1], mask[b : b + 1]))
    return {k: torch.cat([p[k] for p in parts]) if isinstance(parts[0][k], torch.Tensor)
            else [row for p in parts for row in p[k]] for k in parts[0]}


def key_aware_metrics(model: torch.nn.Module, batch: dict[str, torch.Tensor], device=None,
                      check: Callable[[], None] | None = None) -> tuple[dict[str, float], dict]:
    """Logged means and a JSON-able record of the key-aware count on ``batch``.

    ``val/ident/key_aware_alternative_dim``: mean over the *resolved* (example, head) pairs (margin >=
    ``UNRESOLVED_MARGIN``) of the alternatives the head can generate (NaN when none is resolved);
    ``key_aware_identifiable_frac``: share of resolved pairs with no generatable alternative;
    ``key_aware_unresolved_frac``: share of pairs whose count float64 cannot decide (left out of both);
    ``key_agnostic_alternative_dim``: the mean over all pairs of n (n - rank[T, 1]);
    ``key_aware_length_max``: the longest probe; ``key_aware_compute_s``. ``check`` (probes.sigterm_check): run
    before each example, to stop the count between them.
    """
    t0 = time.perf_counter()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    res = key_aware_alternative_dims(model, ids, mask) if check is None else _per_example(model, ids, mask, check)
    alt, agn, ok = res["alternative_dim"][res["resolved"]].double(), res["key_agnostic_dim"].double(), res["resolved"]
    nan = float("nan")
    metrics = {
        f"{PREFIX}/key_aware_alternative_dim": float(alt.mean()) if alt.numel() else nan,
        f"{PREFIX}/key_agnostic_alternative_dim": float(agn.mean()),
        f"{PREFIX}/key_aware_identifiable_frac": float((alt == 0).double().mean()) if alt.numel() else nan,
        f"{PREFIX}/key_aware_unresolved_frac": float((~ok).double().mean()),
        f"{PREFIX}/key_aware_length_max": float(res["lengths"].max()),
        f"{PREFIX}/key_aware_compute_s": time.perf_counter() - t0,
    }
    record = {
        "lengths": res["lengths"].tolist(),
        **{k: res[k].tolist() for k in ("alternative_dim", "key_agnostic_dim", "tangent_dim", "output_rank")},
        "margin": res["margin"],
        "resolved": res["resolved"].tolist(),
        "method": res["method"],
    }
    return metrics, record
