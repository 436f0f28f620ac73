"""The docs/identifiability.md 2.5 key-aware count of alternatives per checkpoint (written to
``<run>/identifiability/key_aware.json``) and its table per configuration and example length."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from .runs import GROUP, ReportWarning

# Key-aware count (docs/identifiability.md 2.5): probe examples nearest these lengths (<cls> included).
# Dense float64 Jacobians of size n^2 x 2n*d_k make it slow beyond ~20 tokens at d_k = 64; 12 lies
# below the baseline's row-stochastic bound d/h + 1 = 17 (no alternatives of any kind), 20 above it.
KEY_AWARE_LENGTHS = (12, 20)


def key_aware_counts(model, input_ids, attention_mask) -> dict:
    """The docs/identifiability.md 2.5 counts of ``key_aware_alternative_dims``, as lists [B][L][H].

    Same maths, cheaper: each head's T (n x d) is replaced by T_r = U_r S_r from its SVD, r = rank(T). T_r
    spans the same column space, so Delta T = 0 exactly when Delta T_r = 0 and rank([T, 1]) = rank([T_r, 1]);
    the map Delta -> Delta T_r has n*r rows instead of n*d (4x fewer for the baseline's d/h = 16), which
    makes its float64 SVD about 16x cheaper. Tested against ``key_aware_alternative_dims``.
    """
    import torch

    from ..diagnostics.identifiability import generatable_alternative_dim, value_output_matrices

    model = model.eval()
    captured = {}
    hooks = [getattr(layer.attn, name).register_forward_hook(
                 lambda _m, _i, out, key=(l, name): captured.__setitem__(key, out.detach()))
             for l, layer in enumerate(model.layers) for name in ("q_proj", "k_proj")]
    try:
        with torch.no_grad():
            internals = model.attention_internals(input_ids, attention_mask)
    finally:
        for h in hooks:
            h.remove()
    _, T_all = value_output_matrices(internals)  # (B, L, H, T, d) float64
    B, L, H = T_all.shape[:3]
    lengths = attention_mask.bool().sum(-1).tolist()
    out = {k: [[[0] * H for _ in range(L)] for _ in range(B)] for k in ("alternative_dim", "key_agnostic_dim",
                                                                        "tangent_dim")}
    for l in range(L):
        q = captured[(l, "q_proj")].double().view(B, -1, H, model.key_dim)  # (B, T, H, dk)
        k = captured[(l, "k_proj")].double().view(B, -1, H, model.key_dim)
        for b, n in enumerate(lengths):
            for h in range(H):
                T = T_all[b, l, h, :n]
                U, S, _ = torch.linalg.svd(T, full_matrices=False)
                r = int(torch.linalg.matrix_rank(T))
                res = generatable_alternative_dim(q[b, :n, h], k[b, :n, h], U[:, :r] * S[:r] if r else T)
                for key in out:
                    out[key][b][l][h] = res[key]
    return {**out, "lengths": lengths}


def default_cache_dir() -> str:
    """Where the report rebuilds a run's tokenized data: conf/paths' ``paths.cache_dir`` default."""
    return os.environ.get("IDT_CACHE_DIR", "~/.cache/identifiable_transformers")


def _probe_batch(run_dir: Path, module, targets=KEY_AWARE_LENGTHS, cache: dict | None = None,
                 cache_dir: str | None = None, what: str = "checkpoint"):
    """The run's probe examples nearest the target lengths, rebuilt from the checkpoint's data settings
    (as plain keyword arguments: a checkpoint's ``_target_`` is never run) with this machine's cache."""
    from ..checkpoint import CheckpointError, data_module_from_checkpoint

    probe = json.loads((run_dir / "identifiability" / "probe.json").read_text())
    picked = []
    for t in targets:
        free = [(abs(n - t), n, i) for i, n in zip(probe["indices"], probe["lengths"]) if i not in picked]
        if free:
            picked.append(min(free)[2])
    data_cfg = module.hparams.get("data_cfg")
    if not data_cfg:
        raise CheckpointError(f"{what} has no data_cfg; cannot rebuild its probe examples")
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
    return dm.collate([dm.val_dataset[i] for i in picked]), picked


def _checkpoint_of(row) -> Path | None:
    best = row["_best_model_path"]
    if not best:
        return None
    for path in (Path(best), Path(row["_dir"]) / "checkpoints" / Path(best).name):  # the sweep may have moved
        if path.is_file():
            return path
    return None


def ensure_key_aware(runs: pd.DataFrame, compute: bool = True, cache_dir: str | None = None) -> list[str]:
    """Write ``<run>/identifiability/key_aware.json`` for every run that lacks it; return notes on skipped runs.

    A run whose checkpoint is refused (damaged, foreign, or naming anything but ``TextDataModule`` in its
    data settings) or whose data cannot be rebuilt here is skipped with a warning; the other runs go on."""
    notes, cache = [], {}
    for _, r in runs.iterrows():
        path = Path(r["_dir"]) / "identifiability" / "key_aware.json"
        if path.is_file():
            continue
        ckpt = _checkpoint_of(r)
        if not compute or ckpt is None or not (path.parent / "probe.json").is_file():
            why = "--no-key-aware" if not compute else "no best checkpoint" if ckpt is None else "no probe.json"
            notes.append(f"{r['run']}: no key_aware.json ({why})")
            continue
        try:
            batch, picked, module = _load_probe(r, ckpt, cache, cache_dir)
        except Exception as ex:
            if not _refusal(r, ex):
                raise
            continue
        counts = key_aware_counts(module.model, batch["input_ids"], batch["attention_mask"].bool())
        path.write_text(json.dumps({"checkpoint": str(ckpt), "split": "validation", "indices": picked, **counts}))
        print(f"key-aware count: {r['run']} ({ckpt.name}, probe examples {picked})", flush=True)
    return notes


def _load_probe(r, ckpt: Path, cache: dict, cache_dir: str | None):
    """(probe batch, probe indices, module) of one run, from its checked checkpoint."""
    from ..lit_module import TextClassifier

    module = TextClassifier.load_from_checkpoint(str(ckpt), map_location="cpu")
    batch, picked = _probe_batch(Path(r["_dir"]), module, cache=cache, cache_dir=cache_dir,
                                 what=f"checkpoint {ckpt}")
    return batch, picked, module


def _refusal(r, ex: Exception) -> bool:
    """Warn and return True if ``ex`` is a user mistake (a refused checkpoint, data missing here); False for a bug."""
    from ..cli import user_error_message

    message = user_error_message(ex)
    if message is None:
        return False
    warnings.warn(f"{r['run']}: no key-aware count, skipped: {message}", ReportWarning, stacklevel=3)
    return True


def key_aware_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Per configuration and example length n: mean ± std over seeds (of the mean over layers and heads)."""
    rows = []
    for _, r in runs.iterrows():
        path = Path(r["_dir"]) / "identifiability" / "key_aware.json"
        if not path.is_file():
            continue
        ka = json.loads(path.read_text())
        for b, n in enumerate(ka["lengths"]):
            rows.append({**{k: r[k] for k in GROUP}, "seed": r["seed"], "n": int(n),
                         **{k: float(np.mean(ka[k][b])) for k in ("alternative_dim", "key_agnostic_dim", "tangent_dim")}})
    if not rows:
        return None
    per_run = pd.DataFrame(rows)
    table = per_run.groupby(GROUP + ["n"])[["alternative_dim", "key_agnostic_dim", "tangent_dim"]].agg(["mean", "std"])
    table.columns = [f"{c}_{stat}" for c, stat in table.columns]
    table["runs"] = per_run.groupby(GROUP + ["n"]).size()
    return table.reset_index()
