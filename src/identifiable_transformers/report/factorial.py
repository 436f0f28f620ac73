"""The 2x2 factorial {head_combine: concat, add} x {value size: small, large} (multirun_sweeps/sweep/factorial.yaml):
does identifiability (the value size) rather than the head combination change an explanation's faithfulness?

Per data set, key size (and every key size pooled: key_dim ``all``, each run one sample), explainer and metric,
from the four cells' means m[c, v] over seeds (c = concat/add, v = small/large value size):

* ``value_size`` (identifiability's main effect): ((m[concat, L] - m[concat, S]) + (m[add, L] - m[add, S])) / 2;
* ``head_combine`` (the other main effect):       ((m[add, S] - m[concat, S]) + (m[add, L] - m[concat, L])) / 2;
* ``interaction``: (m[add, L] - m[add, S]) - (m[concat, L] - m[concat, S]).

Each is a linear contrast sum_k w_k m_k of four independent cell means, so its standard error is
sqrt(sum_k w_k^2 s_k^2 / n_k) and its degrees of freedom Welch-Satterthwaite's (the two-cell contrast with
weights (1, -1) is exactly Welch's test, designs.welch): the ANOVA contrasts without the equal-variance
assumption. Reported: the estimate, its 95% CI and two-sided p; with the preset's margins, the TOST of "the
contrast lies within +-margin" (90% CI inside). The equivalence-range spreads (``val/ident/range_*``) get a
one-sided superiority test instead: the small-value (non-identifiable) arms minus the large-value arms > 0.

A fifth arm, concat at the small value size with its output projection capped at rank r (``model.out_rank``, the
report's ``concat_r<r>``; multirun_sweeps/sweep/factorial_rank.yaml), separates the rank of the attention block's
output from the head combination: add S's output has rank <= S, concat S's up to d. :func:`rank_table` compares it
with the four cells at the same data and key size (:data:`RANK_CONTRASTS`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .designs import FINAL_SCALARS, _var_of_mean
from .faithfulness import _faith_column

# The endpoints (issue 41): raw and effective attention, norm, and value zeroing and ALTI where a run logged them.
ENDPOINTS = ("attention", "effective", "norm", "value_zeroing", "alti")
METRICS = ("comprehensiveness", "sufficiency", "tau_loo", "rationale_auprc", "rationale_f1")
RUN_SCALARS = ("test_acc", "uniform_acc_gap", "identifiable_frac")
CONTRASTS = {  # weights on the cells (concat S, concat L, add S, add L)
    "value_size": (-0.5, 0.5, -0.5, 0.5),
    "head_combine": (-0.5, -0.5, 0.5, 0.5),
    "interaction": (1.0, -1.0, -1.0, 1.0),
}
CELLS = (("concat", "S"), ("concat", "L"), ("add", "S"), ("add", "L"))
# Metrics bounded above by 1 (higher is better), for the head-room flag; sufficiency (lower is better) is bounded
# by the lowest mean any explainer reached on that data (its empirical best, as in issue 41).
UPPER_BOUND = {"comprehensiveness": 1.0, "rationale_auprc": 1.0, "rationale_f1": 1.0, "tau_loo": 1.0,
               "test_acc": 1.0, "adversarial_tv": 1.0}
# A range metric's name: ident/range_*, also inside a length bin (ident/len_le_B/range_*), or faith/.../range_*.
RANGE = re.compile(r"^(ident|faith)/(.*/)?range_")
PAIRS = (("_low", "_high"), ("_min", "_max"), ("_worst", "_best"))
CEILING = 0.9995  # adversarial TV at 1.000 to three decimals
RANK_ARM = re.compile(r"^concat_r\d+$")  # concat with a capped output rank (report/runs.py names it)
RANK_CONTRASTS = {  # weights on the cells (concat S, concat L, add S, add L, the capped concat S)
    "rank_cap": (-1.0, 0.0, 0.0, 0.0, 1.0),  # capped concat S - concat S: the cap alone
    "head_combine_at_rank": (0.0, 0.0, 1.0, 0.0, -1.0),  # add S - capped concat S: same value size and output rank
    "interaction_at_rank": (0.0, -1.0, -1.0, 1.0, 1.0),  # (add L - add S) - (concat L - capped concat S)
}


def contrast(samples: list[np.ndarray], weights: tuple[float, ...]) -> tuple[float, float, float]:
    """sum_k w_k mean(x_k), its standard error and Welch-Satterthwaite degrees of freedom (inf without spread)."""
    terms = [w * w * _var_of_mean(np.asarray(x, float)) for x, w in zip(samples, weights)]
    est = float(sum(w * np.mean(x) for x, w in zip(samples, weights)))
    var = sum(terms)
    if var == 0:
        return est, 0.0, float("inf")
    dof = var**2 / sum(t * t / (len(x) - 1) for t, x in zip(terms, samples) if t > 0)
    return est, float(np.sqrt(var)), float(dof)


def _tests(est: float, se: float, dof: float, margin: float) -> dict:
    from scipy import stats

    if se == 0:  # no spread: the contrast is known exactly
        row = {"ci95_low": est, "ci95_high": est, "p": 1.0 if abs(est) <= 1e-12 else 0.0}
        if np.isfinite(margin):
            row.update(ci90_low=est, ci90_high=est, tost_p=0.0 if abs(est) < margin else 1.0)
        return row
    t95, t90 = float(stats.t.ppf(0.975, dof)), float(stats.t.ppf(0.95, dof))
    row = {"ci95_low": est - t95 * se, "ci95_high": est + t95 * se, "p": float(2 * stats.t.sf(abs(est) / se, dof))}
    if np.isfinite(margin):  # TOST: two one-sided t-tests, equivalent at 5% <=> the 90% CI inside +-margin
        p = max(float(stats.t.sf((est + margin) / se, dof)), float(stats.t.cdf((est - margin) / se, dof)))
        row.update(ci90_low=est - t90 * se, ci90_high=est + t90 * se, tost_p=p)
    return row


def _levels(runs: pd.DataFrame) -> pd.Series:
    """Each run's value size: ``S`` (the smaller of the two value_dim levels: non-identifiable) or ``L``."""
    small = runs.groupby("data")["value_dim"].transform("min")
    return np.where(runs["value_dim"] == small, "S", "L")


def in_factorial(runs: pd.DataFrame) -> pd.Series:
    """Which runs are cells of a 2x2 factorial: per data set, the runs of the two value sizes that were run with both
    head combinations (a data set with one such value size, or more than two, has no factorial)."""
    keep = pd.Series(False, index=runs.index)
    if not {"head_combine", "value_dim", "data"} <= set(runs.columns):
        return keep
    for _, g in runs.groupby("data"):
        both = [v for v, gv in g.groupby("value_dim") if set(gv["head_combine"]) >= {"add", "concat"}]
        if len(both) == 2:
            keep[g.index[g["value_dim"].isin(both) & g["head_combine"].isin(["add", "concat"])]] = True
    return keep


def is_rank_arm(runs: pd.DataFrame) -> pd.Series:
    """Which runs are a capped-rank concat arm (``concat_r<r>``)."""
    return runs["head_combine"].astype(str).str.match(RANK_ARM.pattern) if "head_combine" in runs \
        else pd.Series(False, index=runs.index)


def is_factorial(runs: pd.DataFrame) -> bool:
    """Whether some data set ran all four cells: both head combinations at each of two value sizes."""
    return bool(in_factorial(runs).any())


def left_out_of_factorial(runs: pd.DataFrame) -> str | None:
    """The runs a factorial report leaves out (another design, a third value size, a data set without all four
    cells), named with their settings; None when there are none or no factorial."""
    keep = in_factorial(runs) | is_rank_arm(runs)  # a rank arm has its own table (rank_table)
    if not in_factorial(runs).any() or keep.all():
        return None
    odd = runs[~keep]
    names = "; ".join(f"{r['run']} ({r['data']}, head_combine={r['head_combine']}, value_dim={r['value_dim']}, "
                      f"key_dim={r['key_dim']})" for _, r in odd.iterrows())
    cells = "; ".join(f"{data}: value_dim {sorted(set(g['value_dim']))}" for data, g in runs[keep].groupby("data"))
    return (f"{len(odd)} run(s) are not cells of the 2x2 factorial ({cells}) and are left out of factorial.md and "
            f"findings: {names}. Report them separately (move them to another folder) if they are another study")


def _columns(runs: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(explainer, metric, column) of every endpoint the runs logged; explainer ``-`` for per-run scalars."""
    cols = [(e, m, c) for e in ENDPOINTS for m in METRICS if (c := _faith_column(runs, e, m)) is not None]
    cols += [("-", m, m) for m in RUN_SCALARS if m in runs and runs[m].notna().any()]
    return cols + [("-", m, c) for m, c in FINAL_SCALARS.items() if c in runs and runs[c].notna().any()]


def range_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """The equivalence-range spreads, one column each: every ``*range_*`` metric, except that a ``_low``/``_high``
    (``_min``/``_max``, ``_worst``/``_best``) pair becomes one spread ``<name>_spread`` = |high - low|."""
    names = [c for c in runs.columns if RANGE.match(c)]
    out, used = {}, set()
    for c in names:
        for lo, hi in PAIRS:
            if c.endswith(lo) and (other := c[: -len(lo)] + hi) in names:
                out[c[: -len(lo)] + "_spread"] = (runs[other] - runs[c]).abs()
                used |= {c, other}
    out.update({c: runs[c] for c in names if c not in used})
    return pd.DataFrame(out, index=runs.index)


def _groups(runs: pd.DataFrame):
    for data, g in runs.groupby("data"):
        yield (data, "all"), g
        for k, gk in g.groupby("key_dim"):
            if g["key_dim"].nunique() > 1:
                yield (data, k), gk


def factorial_table(runs: pd.DataFrame, margins: dict[str, float] | None = None) -> pd.DataFrame | None:
    """One row per data, key size (``all`` first), explainer, metric and contrast: the four cells' means, the
    estimate, 95% CI and p; with ``margins`` the TOST (``margin``, ``ci90_low``/``high``, ``tost_p``). Cells need at
    least two runs each. ``None`` unless the runs are a factorial (:func:`is_factorial`)."""
    if not is_factorial(runs):
        return None
    runs = runs[in_factorial(runs)]
    runs = runs.assign(_v=_levels(runs))
    margins = margins or {}
    rows = []
    for (data, key_dim), g in _groups(runs):
        cells = [g[(g["head_combine"] == c) & (g["_v"] == v)] for c, v in CELLS]
        rows += _contrast_rows(runs, cells, CONTRASTS, margins, {"data": data, "key_dim": key_dim})
    return pd.DataFrame(rows) if rows else None


def _contrast_rows(runs: pd.DataFrame, cells: list[pd.DataFrame], contrasts: dict, margins: dict[str, float],
                   keys: dict) -> list[dict]:
    """Per endpoint of ``runs``: each contrast of the cells' means (the first four are CELLS), with its tests."""
    rows = []
    for e, m, col in _columns(runs):
        x = [cell[col].dropna().to_numpy(float) for cell in cells]
        if min(map(len, x)) < 2:
            continue
        means = {f"{c}_{v}": float(np.mean(xi)) for (c, v), xi in zip(CELLS, x)}
        if len(x) > len(CELLS):
            means["capped"] = float(np.mean(x[len(CELLS)]))
        for name, w in contrasts.items():
            est, se, dof = contrast(x, w)
            margin = margins.get(m, np.nan)
            rows.append({**keys, "explainer": e, "metric": m, "contrast": name, **means, "estimate": est, "se": se,
                         "dof": dof, "margin": margin, **_tests(est, se, dof, margin),
                         "runs": "/".join(str(len(xi)) for xi in x)})
    return rows


def range_superiority(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Per data, key size and range spread: small-value (non-identifiable) arms minus large-value arms, averaged
    over the head combinations (minus the value_size contrast), its one-sided 95% lower bound and the one-sided p
    of "the non-identifiable arms' spreads are larger". ``None`` without range metrics or a factorial."""
    from scipy import stats

    if not is_factorial(runs):
        return None
    runs = runs[in_factorial(runs)]
    spreads = range_columns(runs)
    if spreads.empty:
        return None
    runs = pd.concat([runs.assign(_v=_levels(runs)), spreads.add_prefix("_r:")], axis=1)
    w = tuple(-x for x in CONTRASTS["value_size"])
    rows = []
    for (data, key_dim), g in _groups(runs):
        cells = [g[(g["head_combine"] == c) & (g["_v"] == v)] for c, v in CELLS]
        for name in spreads.columns:
            x = [cell["_r:" + name].dropna().to_numpy(float) for cell in cells]
            if min(map(len, x)) < 2:
                continue
            est, se, dof = contrast(x, w)
            if se == 0:
                low, p = est, (0.0 if est > 0 else 1.0)
            else:
                low, p = est - float(stats.t.ppf(0.95, dof)) * se, float(stats.t.sf(est / se, dof))
            rows.append({"data": data, "key_dim": key_dim, "range": name,
                         "non_identifiable": (np.mean(x[0]) + np.mean(x[2])) / 2,
                         "identifiable": (np.mean(x[1]) + np.mean(x[3])) / 2, "difference": est,
                         "ci95_one_sided_low": low, "p_superiority": p,
                         "runs": "/".join(str(len(xi)) for xi in x)})
    return pd.DataFrame(rows) if rows else None


def per_key_outside(table: pd.DataFrame) -> pd.DataFrame:
    """Per-key-size TOST rows whose 90% CI leaves +-margin where the pooled contrast's lies inside it."""
    t = table[np.isfinite(table["margin"])] if "margin" in table else table.iloc[:0]
    if t.empty or "tost_p" not in t:
        return t
    keys = ["data", "explainer", "metric", "contrast"]
    pooled = t[t["key_dim"] == "all"].set_index(keys)["tost_p"]
    per = t[t["key_dim"] != "all"]
    pooled_ok = per.set_index(keys).index.map(lambda k: pooled.get(k, np.nan) < 0.05)
    return per[np.asarray(pooled_ok, bool) & (per["tost_p"].to_numpy() >= 0.05)]


def head_room(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per data, explainer and metric with a margin (pooled key sizes): the best arm's mean and its distance to the
    metric's bound (1 for the UPPER_BOUND metrics; sufficiency: the lowest mean any explainer reached on that
    data), flagged where that head-room is smaller than the margin."""
    t = table[(table["key_dim"] == "all") & (table["contrast"] == "value_size") & np.isfinite(table["margin"])]
    cells = [f"{c}_{v}" for c, v in CELLS]
    rows = []
    for _, r in t.iterrows():
        means = r[cells].to_numpy(float)
        if r["metric"] in UPPER_BOUND:
            best, room = means.max(), UPPER_BOUND[r["metric"]] - means.max()
        elif r["metric"] == "sufficiency":
            floor = min(runs.loc[runs["data"] == r["data"], c].mean() for c in runs.columns
                        if c.startswith("faith/") and c.endswith("/sufficiency") and c.count("/") == 2)
            best, room = means.min(), means.min() - floor
        else:
            continue
        rows.append({"data": r["data"], "explainer": r["explainer"], "metric": r["metric"], "best_arm": best,
                     "head_room": room, "margin": r["margin"], "flag": bool(room < r["margin"])})
    return pd.DataFrame(rows, columns=["data", "explainer", "metric", "best_arm", "head_room", "margin", "flag"])


def tv_ceiling(runs: pd.DataFrame) -> bool:
    """Whether every run's adversarial TV is 1.000 (to three decimals): the search's ceiling, not a finding."""
    col = FINAL_SCALARS["adversarial_tv"]
    return col in runs and runs[col].notna().any() and bool((runs[col].dropna() >= CEILING).all())


def rank_cells(runs: pd.DataFrame):
    """Per data, capped arm and key size where the arm ran at the factorial's small value size: ``(data, arm, key_dim,
    cells)``, cells the five arms' runs in :data:`RANK_CONTRASTS` order (the four factorial cells, then the arm)."""
    capped = runs[is_rank_arm(runs)]
    factorial = runs[in_factorial(runs)]
    factorial = factorial.assign(_v=_levels(factorial))
    for (data, arm), a in capped.groupby(["data", "head_combine"]):
        g = factorial[factorial["data"] == data]
        if g.empty or set(a["value_dim"]) != set(g.loc[g["_v"] == "S", "value_dim"]):
            continue
        for key_dim, ak in a.groupby("key_dim"):
            gk = g[g["key_dim"] == key_dim]
            yield data, arm, key_dim, [gk[(gk["head_combine"] == c) & (gk["_v"] == v)] for c, v in CELLS] + [ak]


def rank_table(runs: pd.DataFrame, margins: dict[str, float] | None = None) -> pd.DataFrame | None:
    """The fifth arm against the four cells: one row per data, key size, explainer, metric and contrast of
    :data:`RANK_CONTRASTS`, with the five means, the estimate, 95% CI and p, and the TOST at the preset's margins.
    None without a capped arm at the factorial's small value size."""
    margins = margins or {}
    rows = []
    for data, arm, key_dim, cells in rank_cells(runs):
        rows += _contrast_rows(runs, cells, RANK_CONTRASTS, margins, {"data": data, "key_dim": key_dim, "arm": arm})
    return pd.DataFrame(rows) if rows else None
