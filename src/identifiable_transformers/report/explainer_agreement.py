"""How close two explainers come on the same probe examples: Kendall tau-b between their token scores (real tokens
after ``<cls>``), averaged over the probe per run, then mean ± std over the seeds of each configuration. The pairs
are raw and effective attention against the context-mixing maps (value zeroing, ALTI): does identifiability change
how close attention comes to them (issue 40)? Read from each run's ``identifiability/explanations.json``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from .faithfulness import _tau_b, load_explanations
from .runs import GROUP

PAIRS = (("attention", "value_zeroing"), ("attention", "alti"), ("effective", "value_zeroing"),
         ("effective", "alti"))


def run_agreement(expl: dict, a: str, b: str) -> float:
    """Mean over the probe examples of Kendall tau-b between explainers ``a`` and ``b`` on tokens 1..n-1; NaN
    where neither example defines it (constant scores, or fewer than 2 tokens) or an explainer is missing."""
    if a not in expl["scores"] or b not in expl["scores"]:
        return float("nan")
    taus = [_tau_b(np.asarray(x[1:n], float), np.asarray(y[1:n], float))
            for n, x, y in zip(expl["lengths"], expl["scores"][a], expl["scores"][b])]
    taus = [t for t in taus if not np.isnan(t)]
    return float(np.mean(taus)) if taus else float("nan")


def explainer_agreement(runs: pd.DataFrame, load: Callable[[Path], dict | None] = load_explanations
                        ) -> pd.DataFrame | None:
    """One row per configuration (``GROUP``) and pair: ``tau_mean``, ``tau_std`` over its runs, and ``runs``.
    ``load`` reads a run's explanations."""
    rows = []
    for keys, g in runs.groupby(GROUP):
        loaded = [x for x in (load(Path(d)) for d in g["_dir"]) if x is not None]
        for a, b in PAIRS:
            taus = [t for t in (run_agreement(x, a, b) for x in loaded) if not np.isnan(t)]
            if taus:
                rows.append({**dict(zip(GROUP, keys)), "pair": f"{a} ~ {b}", "tau_mean": np.mean(taus),
                             "tau_std": np.std(taus, ddof=1) if len(taus) > 1 else np.nan, "runs": len(taus)})
    return pd.DataFrame(rows) if rows else None
