"""The docs/identifiability.md 2.5 key-aware count per checkpoint, at real lengths, beside random heads.

For each run's best checkpoint the report takes, per target length n (``KEY_AWARE_LENGTHS`` or
``--key-aware-lengths``), one validation example at least n tokens long, cut to n, and counts per head
the alternatives the head itself could produce (``generatable_alternative_dim``, exact and structured).
Beside every trained head it counts a *matched random head*: Gaussian Q, K and T of the same shapes (T
with the trained T's rank, its value size), each scaled to the trained one's Frobenius norm, so that the
logits have the same size and attention is as peaked or as flat. Results go to
``<run>/identifiability/key_aware.json``; the table is per configuration and
length, with the key-aware identifiable length (the longest n with no alternative).
A head whose count has a margin below ``UNRESOLVED_MARGIN`` (float64 cannot decide it, issue 34) is
*unresolved*: its count is left out of the means and shares and counted in ``unresolved_heads`` instead.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ..common.files import atomic_write
from ..common.progress import stage, track
from .runs import GROUP, ReportWarning

KEY_AWARE_LENGTHS = (16, 64, 256)
COUNTS = ("alternative_dim", "key_agnostic_dim", "tangent_dim")


def key_aware_counts(model, input_ids, attention_mask, random_heads: bool = True, seed: int = 0) -> dict:
    """Counts per example, layer and head as nested lists [B][L][H], trained and matched random heads.

    Keys: ``alternative_dim``, ``key_agnostic_dim``, ``tangent_dim``, ``margin`` (None: no decision near
    a tolerance), ``resolved``, ``method``, and with ``random_heads`` ``random_alternative_dim``,
    ``random_margin``, ``random_resolved``.
    """
    import torch

    from ..diagnostics.maths.key_aware import generatable_alternative_dim
    from ..diagnostics.maths.key_aware_heads import head_inputs, head_systems

    heads = head_inputs(model, input_ids, attention_mask)
    B, L, H = heads["shape"]
    lengths = heads["lengths"].tolist()
    keys = [*COUNTS, "margin", "resolved", "method"]
    keys += ["random_alternative_dim", "random_margin", "random_resolved"] if random_heads else []
    out = {k: [[[None] * H for _ in range(L)] for _ in range(B)] for k in keys}
    g = torch.Generator().manual_seed(seed)

    def matched(x, rank=None):
        # Gaussian, same Frobenius norm; T keeps its rank (T = V W_o has rank <= value_dim < d in the baseline,
        # and only col(T) matters), so that the random head has the trained one's d_v.
        shape = x.shape if rank is None else (x.shape[0], rank)
        r = torch.randn(shape, generator=g, dtype=x.dtype)
        return r * (x.norm() / r.norm())

    for b, l, h, Q, K, T in head_systems(heads):
        res = generatable_alternative_dim(Q, K, T)
        for k in COUNTS:
            out[k][b][l][h] = res[k]
        out["margin"][b][l][h] = _finite(res["margin"])
        out["resolved"][b][l][h] = res["resolved"]
        out["method"][b][l][h] = res["method"]
        if random_heads:
            rank = int(torch.linalg.matrix_rank(T))
            rnd = generatable_alternative_dim(matched(Q), matched(K), matched(T, rank))
            out["random_alternative_dim"][b][l][h] = rnd["alternative_dim"]
            out["random_margin"][b][l][h] = _finite(rnd["margin"])
            out["random_resolved"][b][l][h] = rnd["resolved"]
    return {**out, "lengths": lengths}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def default_cache_dir() -> str:
    """Where the report rebuilds a run's tokenized data: conf/paths' ``paths.cache_dir`` default."""
    return os.environ.get("IDT_CACHE_DIR", "~/.cache/identifiable_transformers")


def _probe_batch(module, targets=KEY_AWARE_LENGTHS, cache: dict | None = None, cache_dir: str | None = None,
                 what: str = "checkpoint"):
    """Validation examples at the target lengths, rebuilt from the checkpoint's data settings (as plain
    keyword arguments: a checkpoint's ``_target_`` is never run) with this machine's cache."""
    import torch

    from ..diagnostics.callbacks.key_aware_probe import key_aware_batch, pick_examples
    from ..modules.checkpoint import CheckpointError, data_module_from_checkpoint

    data_cfg = module.hparams.get("data_cfg")
    if not data_cfg:
        raise CheckpointError(f"{what} has no data_cfg; cannot rebuild its validation examples")
    key = json.dumps(data_cfg, sort_keys=True, default=str)
    cache = {} if cache is None else cache
    if key not in cache:
        dm = data_module_from_checkpoint(data_cfg, cache_dir or default_cache_dir(), what=what)
        dm.prepare_data()
        dm.setup("fit")
        cache[key] = dm
    dm = cache[key]
    if module.tokenizer is not None and dm.tokenizer.to_str() != module.tokenizer.to_str():
        raise CheckpointError(f"{what}: the rebuilt data's tokenizer differs from the checkpoint's")
    lengths = [len(x) for x in dm.val_dataset["input_ids"]]
    picked = pick_examples(lengths, [t for t in targets if t <= module.model.max_len])
    if not picked:
        return None, [], max(lengths)
    batch = key_aware_batch([dm.val_dataset[i] for i, _ in picked], [n for _, n in picked], module.model.pad_id)
    batch["attention_mask"] = batch["attention_mask"].to(torch.bool)
    return batch, picked, max(lengths)


def _checkpoint_of(row) -> Path | None:
    best = row["_best_model_path"]
    if not best:
        return None
    for path in (Path(best), Path(row["_dir"]) / "checkpoints" / Path(best).name):  # the sweep may have moved
        if path.is_file():
            return path
    return None


def ensure_key_aware(runs: pd.DataFrame, compute: bool = True, cache_dir: str | None = None,
                     targets=KEY_AWARE_LENGTHS) -> list[str]:
    """Write ``<run>/identifiability/key_aware.json`` for every run that lacks it at these target lengths;
    return notes on skipped runs and unreachable lengths.

    A run whose checkpoint is refused (damaged, foreign, or naming anything but ``TextDataModule`` in its
    data settings) or whose data cannot be rebuilt here is skipped with a warning; the other runs go on."""
    notes, cache = [], {}
    targets = [int(t) for t in targets]
    terminal = sys.stderr.isatty()  # a bar on a terminal, else lines (stdout, as the report's summary)
    for _, r in track(runs.iterrows(), "key-aware counts (runs)", total=len(runs), bar=terminal, say=_say):
        path = Path(r["_dir"]) / "identifiability" / "key_aware.json"
        if path.is_file() and json.loads(path.read_text()).get("targets", targets) == targets:
            continue
        ckpt = _checkpoint_of(r)
        if not compute or ckpt is None:
            notes.append(f"{r['run']}: no key_aware.json ({'--no-key-aware' if not compute else 'no best checkpoint'})")
            continue
        try:
            module = _load_module(ckpt)
            batch, picked, longest = _probe_batch(module, targets, cache=cache, cache_dir=cache_dir,
                                                  what=f"checkpoint {ckpt}")
        except Exception as ex:
            if not _refusal(r, ex):
                raise
            continue
        missing = [t for t in targets if t not in {n for _, n in picked}]
        if missing:
            notes.append(f"{r['run']}: no validation example reaches {missing} tokens (longest {longest}, "
                         f"model max_len {module.model.max_len})")
        if batch is None:
            continue
        with stage(f"key-aware count: {r['run']} ({ckpt.name}, lengths {[n for _, n in picked]})", say=_say):
            counts = key_aware_counts(module.model, batch["input_ids"], batch["attention_mask"])
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"checkpoint": str(ckpt), "split": "validation", "targets": targets,
                                       "indices": [i for i, _ in picked], **counts}))
    return notes


def _say(line: str) -> None:
    print(line, flush=True)


def _load_module(ckpt: Path):
    from ..loading import load_module

    return load_module(ckpt)


def _refusal(r, ex: Exception) -> bool:
    """Warn and return True if ``ex`` is a user mistake (a refused checkpoint, data missing here); False for a bug."""
    from ..common.errors import user_error_message

    message = user_error_message(ex)
    if message is None:
        return False
    warnings.warn(f"{r['run']}: no key-aware count, skipped: {message}", ReportWarning, stacklevel=3)
    return True


def _resolved(margins) -> np.ndarray:
    """Per head: margin >= UNRESOLVED_MARGIN (None = no decision near a tolerance = resolved)."""
    from ..diagnostics.maths.key_aware import UNRESOLVED_MARGIN

    m = np.ravel(np.asarray(margins, dtype=object))
    return np.array([x is None or x >= UNRESOLVED_MARGIN for x in m], dtype=bool)


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if x.size else math.nan


def key_aware_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Per configuration and example length n: mean ± std over seeds (of the mean over the resolved layers and
    heads; NaN when none is), the matched random heads' count, the smallest margin, the share of resolved heads
    with no alternative and the share of unresolved heads (margin < UNRESOLVED_MARGIN, decided from the stored
    margins, so files written before the threshold existed are judged the same way)."""
    rows = []
    terminal = sys.stderr.isatty()  # a bar on a terminal, else lines (stdout, as the report's summary)
    for _, r in track(runs.iterrows(), "key-aware counts (runs)", total=len(runs), bar=terminal, say=_say):
        path = Path(r["_dir"]) / "identifiability" / "key_aware.json"
        if not path.is_file():
            continue
        ka = json.loads(path.read_text())
        for b, n in enumerate(ka["lengths"]):
            ok = _resolved(ka["margin"][b]) if "margin" in ka else np.ones(np.size(ka["alternative_dim"][b]), bool)
            alt = np.ravel(ka["alternative_dim"][b])[ok]
            row = {**{k: r[k] for k in GROUP}, "seed": r["seed"], "n": int(n),
                   **{k: _mean(np.ravel(ka[k][b])[ok]) for k in ("alternative_dim", "tangent_dim")},
                   "key_agnostic_dim": float(np.mean(ka["key_agnostic_dim"][b])),
                   "identifiable_heads": _mean(alt == 0), "unresolved_heads": float(np.mean(~ok))}
            if "random_alternative_dim" in ka:
                rok = (_resolved(ka["random_margin"][b]) if "random_margin" in ka
                       else np.ones(np.size(ka["random_alternative_dim"][b]), bool))
                row["random_alternative_dim"] = _mean(np.ravel(ka["random_alternative_dim"][b])[rok])
                row["random_unresolved_heads"] = float(np.mean(~rok))
            if "margin" in ka:
                m = [x for x in np.ravel(np.asarray(ka["margin"][b], dtype=object)) if x is not None]
                row["margin_min"] = float(min(m)) if m else math.inf
            rows.append(row)
    if not rows:
        return None
    per_run = pd.DataFrame(rows)
    values = [c for c in (*COUNTS, "random_alternative_dim") if c in per_run]
    table = per_run.groupby(GROUP + ["n"])[values].agg(["mean", "std"])
    table.columns = [f"{c}_{stat}" for c, stat in table.columns]
    table["identifiable_heads"] = per_run.groupby(GROUP + ["n"])["identifiable_heads"].mean()
    for c in ("unresolved_heads", "random_unresolved_heads"):
        if c in per_run:
            table[c] = per_run.groupby(GROUP + ["n"])[c].mean()
    if "margin_min" in per_run:
        table["margin_min"] = per_run.groupby(GROUP + ["n"])["margin_min"].min()
    table["runs"] = per_run.groupby(GROUP + ["n"]).size()
    return table.reset_index()


def key_aware_lengths(table: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the key-aware identifiable length, the longest tested n such that every head of
    every run is resolved and has no alternative at n and at every shorter tested length (0: not at the
    shortest), the same for the matched random heads, and the tested lengths with unresolved heads."""
    rows = []
    for config, part in table.sort_values("n").groupby(GROUP, dropna=False):
        row = dict(zip(GROUP, config if isinstance(config, tuple) else (config,)))
        unresolved = part["unresolved_heads"] > 0 if "unresolved_heads" in part else part["n"] < 0
        row["identifiable_length"] = _longest_prefix(part["n"], (part["identifiable_heads"] == 1.0) & ~unresolved)
        if "random_alternative_dim_mean" in part:
            r_unres = part["random_unresolved_heads"] > 0 if "random_unresolved_heads" in part else unresolved & False
            row["random_identifiable_length"] = _longest_prefix(part["n"],
                                                                (part["random_alternative_dim_mean"] == 0) & ~r_unres)
        row["unresolved_lengths"] = ",".join(str(int(n)) for n in part["n"][unresolved])
        row["lengths_tested"] = ",".join(str(int(n)) for n in part["n"])
        rows.append(row)
    return pd.DataFrame(rows)


def _longest_prefix(lengths, ok) -> int:
    longest = 0
    for n, good in zip(lengths, ok):
        if not good:
            break
        longest = int(n)
    return longest
