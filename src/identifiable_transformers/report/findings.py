"""Verdicts generated from the statistics: ``findings.csv``, one row per task x key size x explainer x metric x
contrast of a study that compares arms, with the verdict its numbers give under one stated rule.

The rule (:func:`verdict`): ``equivalent`` when the TOST p is below 0.05 at the margin the sweep preset fixed before
the runs; else ``differs`` when the 95% CI excludes 0; else ``not shown``. The numbers are the report's own: the
designs' Welch tests and TOST (:mod:`.designs`), the factorial's contrasts (:mod:`.factorial`), and for a study of one
configuration (MiniLM) each explainer against raw attention on the same runs (:func:`.factorial.contrast` of the
per-run differences: a paired t-test).

``could_fail`` is False where the test could not have failed, and ``why_not`` says why:

* an arm with zero variance (every run the same value: the contrast is a bound or a constant, not an estimate);
* no head-room: every arm lies closer to the metric's bound than the margin allows any contrast to reach (the
  largest contrast of means inside that band is the band's width times the sum of the positive weights);
* a ceiling: every run's adversarial TV is 1.000;
* an identifiability metric on probes that are all beyond, or all within, each arm's identifiable length
  (``identifiability/probe.json``'s ``lengths`` against its ``bounds``): the fraction is then fixed by the lengths.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .designs import FINAL_SCALARS, RUN_SCALARS, design_comparison
from .factorial import (
    CEILING,
    CELLS,
    CONTRASTS,
    ENDPOINTS,
    METRICS,
    RANK_CONTRASTS,
    UPPER_BOUND,
    _levels,
    _tests,
    contrast,
    factorial_table,
    in_factorial,
    range_columns,
    rank_cells,
    rank_table,
)
from .faithfulness import EXPLAINER_ORDER, _faith_column

COLUMNS = ["task", "key_dim", "explainer", "metric", "contrast", "estimate", "ci95_low", "ci95_high", "ci90_low",
           "ci90_high", "margin", "tost_p", "p", "verdict", "could_fail", "why_not", "runs"]
ALPHA = 0.05
# identifiability metric -> the probe.json bound it counts against (identifiable: n <= bound)
IDENT_BOUNDS = {"identifiable_frac": "head"}
RANGE_CONTRAST = "S - L"  # the equivalence-range spreads: non-identifiable (small value size) minus identifiable arms


def verdict(tost_p: float, ci95_low: float, ci95_high: float) -> str:
    """``equivalent`` when TOST p < 0.05, else ``differs`` when the 95% CI excludes 0, else ``not shown``."""
    if np.isfinite(tost_p) and tost_p < ALPHA:
        return "equivalent"
    if ci95_low > 0 or ci95_high < 0:
        return "differs"
    return "not shown"


def _column(runs: pd.DataFrame, explainer: str, metric: str) -> str | None:
    if explainer == "-":
        col = metric if metric in RUN_SCALARS else FINAL_SCALARS.get(metric, metric)
        return col if col in runs else None
    return _faith_column(runs, explainer, metric)


def _probe(run_dir: str) -> dict | None:
    try:
        probe = json.loads((Path(run_dir) / "identifiability" / "probe.json").read_text())
        return probe if isinstance(probe.get("lengths"), list) and isinstance(probe.get("bounds"), dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def _fixed_by_lengths(metric: str, arms: list[tuple[str, pd.DataFrame]]) -> str | None:
    """Why an identifiability metric could not fail: every arm's probes all beyond (or all within) its bound."""
    key = IDENT_BOUNDS.get(metric)
    if key is None or "_dir" not in arms[0][1]:
        return None
    said = []
    for name, g in arms:
        probes = [_probe(d) for d in g["_dir"]]
        if not probes or any(p is None or key not in p["bounds"] for p in probes):
            return None  # unknown: not claimed either way
        lengths = [n for p in probes for n in p["lengths"]]
        bounds = {int(p["bounds"][key]) for p in probes}
        if len(bounds) > 1:
            return None
        bound = bounds.pop()
        where = ("beyond" if min(lengths) > bound else "within" if max(lengths) <= bound else None)
        if where is None:
            return None
        said.append(f"{name}'s probes ({min(lengths)}-{max(lengths)} tokens) all {where} its identifiable length "
                    f"{bound}")
    return "; ".join(said)


def why_not(metric: str, arms: list[tuple[str, pd.DataFrame]], col: str, weights: tuple[float, ...],
            margin: float, floor: float | None) -> list[str]:
    """The reasons a row's test could not have failed (empty: it could)."""
    xs = [(name, g[col].dropna().to_numpy(float)) for name, g in arms]
    flat = [f"{name} is {x[0]:.4g}" for name, x in xs if len(x) > 1 and np.ptp(x) == 0]
    reasons = [f"zero variance: every run of {', '.join(flat)}"] if flat else []
    means = np.array([x.mean() for _, x in xs if len(x)])
    reach = sum(w for w in weights if w > 0)
    if np.isfinite(margin) and len(means) == len(xs):
        bound, band = None, None
        if metric in UPPER_BOUND:
            bound, band = UPPER_BOUND[metric], float((UPPER_BOUND[metric] - means).max())
        elif metric == "sufficiency" and floor is not None:
            bound, band = floor, float((means - floor).max())
        if band is not None and band * reach < margin:
            reasons.append(f"no head-room: every arm within {band:.3g} of the bound {bound:.3g}, so no contrast can "
                           f"reach ±{margin:g}")
    if metric == "adversarial_tv" and all(len(x) and (x >= CEILING).all() for _, x in xs):
        reasons.append("every run at the adversarial search's ceiling (TV 1.000)")
    fixed = _fixed_by_lengths(metric, arms)
    if fixed:
        reasons.append(f"set by the probe lengths: {fixed}")
    return reasons


def _sufficiency_floor(runs: pd.DataFrame) -> float | None:
    """The lowest mean sufficiency any explainer reached on these runs (its empirical best, as factorial.head_room)."""
    cols = [c for c in runs.columns if c.startswith("faith/") and c.endswith("/sufficiency") and c.count("/") == 2]
    means = [runs[c].mean() for c in cols if runs[c].notna().any()]
    return float(min(means)) if means else None


def _row(task, key_dim, explainer, metric, name, stats: dict, reasons: list[str], runs: str) -> dict:
    row = {"task": task, "key_dim": key_dim, "explainer": explainer, "metric": metric, "contrast": name,
           "estimate": stats["estimate"], "ci95_low": stats["ci95_low"], "ci95_high": stats["ci95_high"],
           "ci90_low": stats.get("ci90_low", np.nan), "ci90_high": stats.get("ci90_high", np.nan),
           "margin": stats.get("margin", np.nan), "tost_p": stats.get("tost_p", np.nan), "p": stats["p"]}
    row["verdict"] = verdict(row["tost_p"], row["ci95_low"], row["ci95_high"])
    return {**row, "could_fail": not reasons, "why_not": "; ".join(reasons), "runs": runs}


def _in_key(g: pd.DataFrame, key_dim) -> pd.DataFrame:
    return g if key_dim == "all" else g[g["key_dim"].astype(str) == str(key_dim)]


def design_findings(runs: pd.DataFrame, margins: dict[str, float]) -> pd.DataFrame | None:
    """Identifiable (add) minus baseline (concat), from :func:`.designs.design_comparison`: key sizes pooled, and per
    key size where a data set ran several."""
    pooled = design_comparison(runs, pool_key_sizes=True, margins=margins)
    if pooled is None:
        return None
    per_key = design_comparison(runs, margins=margins)
    several = runs.groupby("data")["key_dim"].nunique()
    per_key = per_key[per_key["data"].map(several) > 1] if per_key is not None else None
    rows = []
    floors = {data: _sufficiency_floor(g) for data, g in runs.groupby("data")}
    for _, r in pd.concat([pooled, per_key], ignore_index=True).iterrows():
        if r["explainer"] not in (*ENDPOINTS, "-"):
            continue
        g = _in_key(runs[runs["data"] == r["data"]], r["key_dim"])
        arms = [("add", g[g["head_combine"] == "add"]), ("concat", g[g["head_combine"] == "concat"])]
        col = _column(runs, r["explainer"], r["metric"])
        stats = {"estimate": r["difference"], "p": r["welch_p"], **r.to_dict()}
        reasons = why_not(r["metric"], arms, col, (1.0, -1.0), stats.get("margin", np.nan), floors[r["data"]])
        rows.append(_row(r["data"], r["key_dim"], r["explainer"], r["metric"], "add - concat", stats, reasons,
                         r["seeds"]))
    return pd.DataFrame(rows, columns=COLUMNS) if rows else None


def factorial_findings(runs: pd.DataFrame, margins: dict[str, float]) -> pd.DataFrame | None:
    """The factorial's main effects and interaction (:func:`.factorial.factorial_table`), and the equivalence-range
    spreads' S - L contrast (two-sided here; factorial.md keeps its one-sided superiority test)."""
    table = factorial_table(runs, margins)
    if table is None:
        return None
    runs_all, runs = runs, runs[in_factorial(runs)]
    runs = runs.assign(_v=_levels(runs))
    sizes = runs.groupby(["data", "_v"])["value_dim"].first()

    def arms(data, key_dim):
        g = _in_key(runs[runs["data"] == data], key_dim)
        return [(f"{c}/{sizes[(data, v)]}", g[(g["head_combine"] == c) & (g["_v"] == v)]) for c, v in CELLS]

    rows = []
    floors = {data: _sufficiency_floor(g) for data, g in runs.groupby("data")}
    for _, r in table.iterrows():
        col = _column(runs, r["explainer"], r["metric"])
        reasons = why_not(r["metric"], arms(r["data"], r["key_dim"]), col, CONTRASTS[r["contrast"]],
                          r["margin"], floors[r["data"]])
        rows.append(_row(r["data"], r["key_dim"], r["explainer"], r["metric"], r["contrast"], r.to_dict(), reasons,
                         r["runs"]))
    spreads = range_columns(runs)
    w = tuple(-x for x in CONTRASTS["value_size"])
    with_spreads = pd.concat([runs, spreads.add_prefix("_r:")], axis=1)
    for data, g in with_spreads.groupby("data"):
        for key_dim in ["all", *(sorted(g["key_dim"].unique()) if g["key_dim"].nunique() > 1 else [])]:
            cell_arms = [(name, with_spreads.loc[a.index]) for name, a in arms(data, key_dim)]
            for name in spreads.columns:
                x = [a["_r:" + name].dropna().to_numpy(float) for _, a in cell_arms]
                if min(map(len, x)) < 2:
                    continue
                est, se, dof = contrast(x, w)
                stats = {"estimate": est, **_tests(est, se, dof, np.nan)}
                reasons = why_not(name, cell_arms, "_r:" + name, w, np.nan, None)
                rows.append(_row(data, key_dim, "-", name, RANGE_CONTRAST, stats, reasons,
                                 "/".join(str(len(xi)) for xi in x)))
    rows += _rank_rows(runs_all, margins, floors)
    return pd.DataFrame(rows, columns=COLUMNS) if rows else None


def _rank_rows(runs: pd.DataFrame, margins: dict[str, float], floors: dict) -> list[dict]:
    """The capped-rank arm's contrasts (:func:`.factorial.rank_table`), one row each."""
    table = rank_table(runs, margins)
    if table is None:
        return []
    arms = {(data, arm, key_dim): cells for data, arm, key_dim, cells in rank_cells(runs)}
    sizes = runs[in_factorial(runs)].groupby("data")["value_dim"].agg(["min", "max"])
    rows = []
    for _, r in table.iterrows():
        small, large = sizes.loc[r["data"], "min"], sizes.loc[r["data"], "max"]
        names = [f"concat/{small}", f"concat/{large}", f"add/{small}", f"add/{large}", f"{r['arm']}/{small}"]
        col = _column(runs, r["explainer"], r["metric"])
        reasons = why_not(r["metric"], list(zip(names, arms[(r["data"], r["arm"], r["key_dim"])])), col,
                          RANK_CONTRASTS[r["contrast"]], r["margin"], floors.get(r["data"]))
        rows.append(_row(r["data"], r["key_dim"], r["explainer"], r["metric"], f"{r['contrast']} ({r['arm']})",
                         r.to_dict(), reasons, r["runs"]))
    return rows


def explainer_findings(runs: pd.DataFrame, margins: dict[str, float]) -> pd.DataFrame | None:
    """A study of one configuration per data set (MiniLM): each explainer minus raw attention on the same runs (a
    paired t-test over the runs), and the identifiable fraction itself (its mean against 0)."""
    rows = []
    for data, g in runs.groupby("data"):
        for m in METRICS:
            base = _faith_column(g, "attention", m)
            if base is None:
                continue
            for e in EXPLAINER_ORDER[1:]:
                col = _faith_column(g, e, m)
                if col is None:
                    continue
                d = (g[col] - g[base]).dropna().to_numpy(float)
                if len(d) < 2:
                    continue
                est, se, dof = contrast([d], (1.0,))
                margin = margins.get(m, np.nan)
                stats = {"estimate": est, "margin": margin, **_tests(est, se, dof, margin)}
                diff = pd.DataFrame({"d": d})
                reasons = why_not(m, [(f"{e} - attention", diff)], "d", (1.0,), np.nan, None)
                rows.append(_row(data, "all", e, m, "minus attention", stats, reasons, str(len(d))))
        for metric in IDENT_BOUNDS:
            if metric in g and g[metric].notna().sum() >= 2:
                x = g[metric].dropna().to_numpy(float)
                est, se, dof = contrast([x], (1.0,))
                reasons = why_not(metric, [("the study", g)], metric, (1.0,), np.nan, None)
                rows.append(_row(data, "all", "-", metric, "level", {"estimate": est, **_tests(est, se, dof, np.nan)},
                                 reasons, str(len(x))))
    return pd.DataFrame(rows, columns=COLUMNS) if rows else None


def findings(runs: pd.DataFrame, margins: dict[str, float]) -> tuple[str, pd.DataFrame] | None:
    """The study's kind (``factorial``, ``designs`` or ``explainers``) and its findings; None without any."""
    if in_factorial(runs).any():
        table = factorial_findings(runs, margins)
        return None if table is None else ("factorial", table)
    if {"add", "concat"} <= set(runs["head_combine"]):
        table = design_findings(runs, margins)
        return None if table is None else ("designs", table)
    if runs.groupby("data")[["head_combine", "value_dim", "key_dim"]].nunique().max().max() == 1:
        table = explainer_findings(runs, margins)
        return None if table is None else ("explainers", table)
    return None
