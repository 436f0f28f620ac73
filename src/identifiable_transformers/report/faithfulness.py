"""Faithfulness over seeds: the faithfulness table (mean ± std per configuration and explainer) and the
seeds' agreement on the same probe examples (Jensen-Shannon divergence, Kendall tau-b). The designs'
comparison (Welch and equivalence tests) is in designs.py."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from .runs import GROUP

FAITH_METRICS = ("comprehensiveness", "sufficiency", "tau_loo", "flip_frac", "rationale_auprc", "rationale_f1")
FAITH_KEY = re.compile(rf"^val/faith/([a-z0-9_]+)/({'|'.join(FAITH_METRICS)})$")
EXPLAINER_ORDER = ("attention", "effective", "norm", "rollout", "value_zeroing", "alti", "norm_resln", "grad_input",
                   "integrated_gradients", "loo", "random")
# Explainers whose scores are non-negative, so that renormalised they are distributions over the tokens.
DISTRIBUTION_EXPLAINERS = ("attention", "norm", "rollout", "value_zeroing", "alti", "norm_resln")


def _faith_column(runs: pd.DataFrame, explainer: str, metric: str) -> str | None:
    """Per-epoch ``faith/<e>/<m>``, else the end-of-fit ``faith/final/<e>/<m>`` (integrated gradients)."""
    for col in (f"faith/{explainer}/{metric}", f"faith/final/{explainer}/{metric}"):
        if col in runs and runs[col].notna().any():
            return col
    return None


def faithfulness_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Mean ± std over seeds of every explainer's comprehensiveness, sufficiency, tau_loo and flip_frac, and
    on data with rationales its plausibility (rationale_auprc, rationale_f1); n/a where a run did not log one."""
    found = {m.group(1) for c in runs.columns if (m := FAITH_KEY.match("val/" + c.replace("faith/final/", "faith/")))}
    if not found:
        return None
    explainers = [e for e in EXPLAINER_ORDER if e in found] + sorted(found - set(EXPLAINER_ORDER))
    rows = []
    for keys, g in runs.groupby(GROUP):
        for e in explainers:
            row = {**dict(zip(GROUP, keys)), "explainer": e}
            n = 0
            for m in FAITH_METRICS:
                col = _faith_column(runs, e, m)
                vals = g[col].dropna() if col else pd.Series(dtype=float)
                row[f"{m}_mean"], row[f"{m}_std"] = vals.mean(), vals.std()
                n = max(n, len(vals))
            row["runs"] = n
            rows.append(row)
    return pd.DataFrame(rows)


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence in bits (base 2, so it lies in [0, 1]); p, q are renormalised first."""
    p, q = np.asarray(p, float) / np.sum(p), np.asarray(q, float) / np.sum(q)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> float:
        nz = a > 0  # 0 log 0 = 0; m > 0 wherever a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    return 0.5 * kl(p) + 0.5 * kl(q)


def _tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall tau-b of two score vectors (docs/faithfulness.md's ``kendall_tau_b``); NaN when undefined."""
    import torch

    from ..diagnostics.faithfulness import kendall_tau_b

    x, y = torch.as_tensor(x)[None], torch.as_tensor(y)[None]
    return float(kendall_tau_b(x, y, torch.ones_like(x, dtype=torch.bool))[0])


def load_explanations(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "identifiability" / "explanations.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _distributions(expl: dict, explainer: str) -> dict[int, np.ndarray]:
    """probe index -> the explainer's scores over the real tokens 1..n-1 (``<cls>`` dropped), renormalised."""
    out = {}
    for idx, n, scores in zip(expl["indices"], expl["lengths"], expl["scores"][explainer]):
        s = np.asarray(scores[1:n], float)
        if (s < 0).any():
            raise ValueError(f"{explainer} scores of probe example {idx} are negative: not a distribution")
        if len(s) and s.sum() > 0:
            out[int(idx)] = s / s.sum()
    return out


def seed_agreement(runs: pd.DataFrame, load: Callable[[Path], dict | None] = load_explanations
                   ) -> tuple[pd.DataFrame | None, list[str]]:
    """Per configuration (all equal but the seed) and explainer: mean JSD between the seeds' explanations.

    Examples are matched by probe index; the JSD is averaged over the examples two runs share, then over
    the pairs of runs. ``jsd_uniform`` is the mean JSD of each run's explanation to the uniform distribution
    over the same tokens: agreement means little when both explanations are nearly uniform. ``tau_seeds``
    is the Kendall tau-b between the seeds' scores (mean over examples, then pairs): do they rank alike?
    Returns the table and notes about runs that were left out. ``load`` reads a run's explanations.
    """
    notes, rows = [], []
    for keys, g in runs.groupby(GROUP):
        loaded = []
        for _, r in g.iterrows():
            expl = load(Path(r["_dir"]))
            if expl is None:
                notes.append(f"{r['run']}: no identifiability/explanations.json (seed agreement without it)")
            else:
                loaded.append((r["seed"], expl))
        if not loaded:
            continue
        for e in DISTRIBUTION_EXPLAINERS:
            dists = [(seed, _distributions(x, e)) for seed, x in loaded if e in x["scores"]]
            if not dists:
                continue
            pair_means, pair_taus, n_examples = [], [], set()
            for (sa, a), (sb, b) in itertools.combinations(dists, 2):
                common = sorted(set(a) & set(b))
                if sa == sb or not common:
                    continue
                if any(len(a[i]) != len(b[i]) for i in common):
                    raise ValueError(f"probe examples of {keys} differ in length between seeds {sa} and {sb}: "
                                     "the runs were not trained on the same data")
                pair_means.append(np.mean([js_divergence(a[i], b[i]) for i in common]))
                taus = [_tau_b(a[i], b[i]) for i in common]
                taus = [t for t in taus if not np.isnan(t)]  # undefined for constant scores or n - 1 < 2
                pair_taus.append(np.mean(taus) if taus else np.nan)
                n_examples.update(common)
            to_uniform = [js_divergence(d, np.ones_like(d)) for _, ds in dists for d in ds.values()]
            rows.append({**dict(zip(GROUP, keys)), "explainer": e,
                         "jsd_seeds_mean": np.mean(pair_means) if pair_means else np.nan,
                         "jsd_seeds_std": np.std(pair_means, ddof=1) if len(pair_means) > 1 else np.nan,
                         "jsd_uniform_mean": np.mean(to_uniform) if to_uniform else np.nan,
                         "tau_seeds_mean": np.nanmean(pair_taus) if np.isfinite(pair_taus).any() else np.nan,
                         "tau_seeds_std": np.nanstd(pair_taus, ddof=1) if np.isfinite(pair_taus).sum() > 1 else np.nan,
                         "pairs": len(pair_means), "examples": len(n_examples)})
    return (pd.DataFrame(rows) if rows else None), notes
