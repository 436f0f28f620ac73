"""Identifiable (add) against baseline (concat): the difference of means per dataset, key size, explainer and
metric, with a Welch test of "they differ" and, at margins the sweep preset fixed before the runs, an
equivalence test (TOST) of "they differ by less than the margin"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..common.errors import UserError
from ..common.files import atomic_write
from .code_note import code_note
from .faithfulness import EXPLAINER_ORDER, FAITH_METRICS, _faith_column

# Per-run scalars compared like the explainers' metrics (as explainer "-"): is attention needed, how
# accurate, how identifiable; and how far the adversarial search moved the attention (end of fit).
RUN_SCALARS = ("uniform_acc_gap", "test_acc", "identifiable_frac")
FINAL_SCALARS = {"adversarial_tv": "faith/final/adversarial_tv"}
# Where a run's config records the equivalence margins (the sweep preset's report.equivalence_margins).
MARGINS_KEY = "report.equivalence_margins"
CONFIG_FILES = ("config_resolved.yaml", ".hydra/config.yaml")


def _var_of_mean(x: np.ndarray) -> float:
    """The squared standard error of the mean; exactly 0 when every value is equal (numpy's variance of
    [0.4, 0.4, 0.4] is 1e-32, not 0)."""
    return float(x.var(ddof=1)) / len(x) if np.ptp(x) > 0 else 0.0


def welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Difference of means a - b, half-width of its Welch 95% confidence interval, and the Welch test's p."""
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = _var_of_mean(a), _var_of_mean(b)
    diff, se = a.mean() - b.mean(), float(np.sqrt(va + vb))
    if se == 0:  # no spread: the means are equal (up to rounding) or they differ for certain
        return diff, 0.0, (1.0 if abs(diff) <= 1e-12 * max(1.0, abs(a.mean()), abs(b.mean())) else 0.0)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return diff, float(stats.t.ppf(0.975, dof)) * se, float(2 * stats.t.sf(abs(diff) / se, dof))


def tost(a: np.ndarray, b: np.ndarray, margin: float) -> tuple[float, float, float]:
    """Equivalence test of the means of a and b within ``margin`` (two one-sided Welch t-tests, Schuirmann's TOST).

    H0: |mean(a) - mean(b)| >= margin. The lower test's p is P(T >= (diff + margin) / se), the upper test's
    P(T <= (diff - margin) / se), with Welch's standard error and degrees of freedom; the TOST p is the larger.
    p < 0.05 (equivalent at 5%) exactly when the 90% confidence interval of the difference lies inside
    (-margin, margin). Returns (the 90% interval's low and high ends, the TOST p)."""
    from scipy import stats

    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin}")
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = _var_of_mean(a), _var_of_mean(b)
    diff, se = a.mean() - b.mean(), float(np.sqrt(va + vb))
    if se == 0:  # no spread: the difference is known exactly
        return diff, diff, (0.0 if abs(diff) < margin else 1.0)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    p_lower = float(stats.t.sf((diff + margin) / se, dof))
    p_upper = float(stats.t.cdf((diff - margin) / se, dof))
    half = float(stats.t.ppf(0.95, dof)) * se
    return diff - half, diff + half, max(p_lower, p_upper)


def design_comparison(runs: pd.DataFrame, pool_key_sizes: bool = False,
                      margins: dict[str, float] | None = None) -> pd.DataFrame | None:
    """Identifiable (add) minus baseline (concat) per dataset, key size, explainer and metric, over seeds:
    the means and standard deviations, the difference of means, its Welch 95% confidence interval and the
    Welch test's p-value; with ``margins`` ({metric: margin}) also the equivalence test (``tost``) of every
    metric that has one: ``margin``, the 90% interval (``ci90_low``, ``ci90_high``) and ``tost_p``.

    ``uniform_acc_gap`` (is attention needed?), ``test_acc``, ``identifiable_frac`` and the end-of-fit
    ``adversarial_tv`` are compared the same way, as explainer ``-``. ``pool_key_sizes``: one comparison per
    dataset over every key size's runs (key_dim ``all``; each run one sample). Rows need at least two runs
    of each design."""
    cols = [(e, m, _faith_column(runs, e, m)) for e in EXPLAINER_ORDER for m in FAITH_METRICS]
    cols = [c for c in cols if c[2] is not None] + [("-", m, m) for m in RUN_SCALARS if m in runs]
    cols += [("-", m, c) for m, c in FINAL_SCALARS.items() if c in runs and runs[c].notna().any()]
    if not cols or "head_combine" not in runs or set(runs["head_combine"]) < {"add", "concat"}:
        return None
    groups = (((data, "all"), g) for data, g in runs.groupby("data")) if pool_key_sizes \
        else runs.groupby(["data", "key_dim"])
    margins = margins or {}
    rows = []
    for (data, key_dim), g in groups:
        add, concat = g[g["head_combine"] == "add"], g[g["head_combine"] == "concat"]
        for e, m, col in cols:
            a, b = add[col].dropna().to_numpy(float), concat[col].dropna().to_numpy(float)
            if len(a) < 2 or len(b) < 2:
                continue
            diff, half, p = welch(a, b)
            row = {"data": data, "key_dim": key_dim, "explainer": e, "metric": m,
                   "identifiable": a.mean(), "identifiable_std": a.std(ddof=1), "baseline": b.mean(),
                   "baseline_std": b.std(ddof=1), "difference": diff, "ci95_low": diff - half,
                   "ci95_high": diff + half, "welch_p": p, "seeds": f"{len(a)}/{len(b)}"}
            if margins:
                margin = margins.get(m, np.nan)
                low, high, tp = tost(a, b, margin) if np.isfinite(margin) else (np.nan, np.nan, np.nan)
                row.update(margin=margin, ci90_low=low, ci90_high=high, tost_p=tp)
            rows.append(row)
    return pd.DataFrame(rows) if rows else None


def equivalence_margins(runs: pd.DataFrame) -> dict[str, float]:
    """The equivalence margins the runs were swept with: ``report.equivalence_margins`` ({metric: margin})
    of each run's ``config_resolved.yaml`` (else ``.hydra/config.yaml``). Runs without it add nothing; runs
    whose margins differ are a user error (one study, one set of margins, fixed before the runs)."""
    from omegaconf import OmegaConf

    found: dict[tuple, list[str]] = {}
    for _, r in runs.iterrows():
        if "_dir" not in r or not isinstance(r["_dir"], str):
            continue
        for name in CONFIG_FILES:
            path = Path(r["_dir"]) / name
            if path.is_file():
                node = _margins_node(path)
                if node is not None:
                    margins = node if isinstance(node, dict) else OmegaConf.to_container(node, resolve=True)
                    if not isinstance(margins, dict) or not all(_positive(v) for v in margins.values()):
                        raise UserError(f"{path}: {MARGINS_KEY} must map metric names to margins > 0, got {margins}")
                    found.setdefault(tuple(sorted((str(k), float(v)) for k, v in margins.items())), []).append(r["run"])
                break
    if len(found) > 1:
        sets = "; ".join(f"{dict(k)} in {', '.join(v[:3])}{' ...' if len(v) > 3 else ''}" for k, v in found.items())
        raise UserError(f"the runs were swept with different equivalence margins ({sets}): report each study "
                        "separately, or give its runs one set of margins")
    return dict(next(iter(found))) if found else {}


def _margins_node(path: Path):
    """``report.equivalence_margins`` of a run's config: read with libyaml's C loader when it holds plain numbers
    (a resolved config: 10x faster than OmegaConf on a sweep's hundreds of files), else through OmegaConf (which
    resolves interpolations)."""
    import yaml
    from omegaconf import OmegaConf

    try:
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        node = (data.get("report") or {}).get("equivalence_margins") if isinstance(data, dict) else None
        if node is None or (isinstance(node, dict) and all(isinstance(v, (int, float)) for v in node.values())):
            return node
    except (yaml.YAMLError, AttributeError):
        pass
    return OmegaConf.select(OmegaConf.load(path), MARGINS_KEY, default=None)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def designs_markdown(pooled: pd.DataFrame | None, per_key: pd.DataFrame | None, margins: dict[str, float]) -> str:
    tost_text = (" Equivalence (TOST, two one-sided Welch t-tests) at the margins fixed in the sweep preset before "
                 f"the runs ({', '.join(f'{k} ±{v:g}' for k, v in sorted(margins.items()))}): 90% CI, TOST p; "
                 "equivalent at 5% when TOST p < 0.05 (the 90% CI inside ± the margin)." if margins else "")
    lines = ["Identifiable (add) minus baseline (concat): mean ± std of each design's runs, difference of means, "
             "Welch 95% CI, p-value. First every key size pooled (key_dim `all`: each run one sample), then per key "
             "size (over seeds). Explainer `-`: per-run scalars." + tost_text, ""]
    head = "| data | key_dim | explainer | metric | identifiable | baseline | difference | 95% CI | Welch p |"
    head += " margin | 90% CI | TOST p | runs |" if margins else " runs |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    if per_key is None:
        per_key = pd.DataFrame()
    for d in (pooled, per_key):
        if d is None:
            continue
        for _, r in d.iterrows():
            line = (f"| {r['data']} | {r['key_dim']} | {r['explainer']} | {r['metric']} | "
                    f"{r['identifiable']:.3f} ± {r['identifiable_std']:.3f} | {r['baseline']:.3f} ± "
                    f"{r['baseline_std']:.3f} | {r['difference']:+.3f} | [{r['ci95_low']:+.3f}, "
                    f"{r['ci95_high']:+.3f}] | {r['welch_p']:.3g} |")
            if margins:
                line += (f" {r['margin']:g} | [{r['ci90_low']:+.3f}, {r['ci90_high']:+.3f}] | {r['tost_p']:.3g} |"
                         if np.isfinite(r["margin"]) else " - | - | - |")
            lines.append(line + f" {r['seeds']} |")
    if per_key.empty:
        lines += ["", "No key size was run with both designs, so there is no per-key-size comparison (only the "
                      "pooled one above)."]
    return "\n".join(lines) + "\n"


def write_design_comparison(runs: pd.DataFrame, out: Path) -> list[Path]:
    """Write ``faithfulness_designs.md`` and ``.csv`` when the runs hold both designs (at least two runs of
    each), pooled over key sizes and, where a key size has both, per key size. Returns the files written."""
    margins = equivalence_margins(runs)
    pooled = design_comparison(runs, pool_key_sizes=True, margins=margins)
    if pooled is None:
        return []
    per_key = design_comparison(runs, margins=margins)
    atomic_write(out / "faithfulness_designs.csv", pd.concat([pooled, per_key], ignore_index=True).to_csv(index=False))
    atomic_write(out / "faithfulness_designs.md",
                 designs_markdown(pooled, per_key, margins) + "\n" + code_note(runs) + "\n")
    return [out / "faithfulness_designs.md", out / "faithfulness_designs.csv"]
