"""The designs' comparison of the report: Welch and equivalence (TOST) tests, the margins a sweep preset fixes,
and the pooled faithfulness_designs.md of a sweep whose designs ran at different key sizes."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from identifiable_transformers.report import main
from identifiable_transformers.report.designs import design_comparison, equivalence_margins, tost


def _t4_cdf(t: float) -> float:
    """Student's t CDF with 4 degrees of freedom in closed form: F(t) = 1/2 + (3/4) s (1 - s^2 / 3),
    s = t / sqrt(4 + t^2)."""
    s = t / math.sqrt(4 + t * t)
    return 0.5 + 0.75 * s * (1 - s * s / 3)


def test_t4_closed_form_is_the_t_distribution():  # the reference below rests on it
    for t in (-3.0, -1.2247, 0.0, 0.5, 3.674):
        assert _t4_cdf(t) == pytest.approx(stats.t.cdf(t, 4), abs=1e-12)


def test_tost_by_hand_on_equal_variances():
    """a = [1, 2, 3], b = [0, 1, 2]: difference 1, variances 1, se = sqrt(2/3), Welch's dof = 2 (n - 1) = 4."""
    a, b = [1.0, 2.0, 3.0], [0.0, 1.0, 2.0]
    se = math.sqrt(2 / 3)
    low, high, p = tost(a, b, 2.0)
    p_lower = 1 - _t4_cdf((1 + 2) / se)  # H0: diff <= -2
    p_upper = _t4_cdf((1 - 2) / se)      # H0: diff >= 2
    assert p == pytest.approx(max(p_lower, p_upper), rel=1e-9)
    assert p == pytest.approx(p_upper) and 0.1 < p < 0.2  # not equivalent within +-2 with 3 samples each
    q95 = stats.t.ppf(0.95, 4)
    assert (low, high) == (pytest.approx(1 - q95 * se), pytest.approx(1 + q95 * se))
    _, _, p_wide = tost(a, b, 4.0)
    assert p_wide == pytest.approx(_t4_cdf((1 - 4) / se)) and p_wide < 0.05


@pytest.mark.parametrize("seed", range(5))
def test_tost_is_two_one_sided_welch_tests(seed):
    """Against scipy's Welch t-tests on shifted samples, and the 90% CI of scipy's Welch test."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0.5, 0.05, 7 + seed), rng.normal(0.52, 0.1, 12)
    margin = 0.04
    low, high, p = tost(a, b, margin)
    p_lower = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater").pvalue
    p_upper = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less").pvalue
    assert p == pytest.approx(max(p_lower, p_upper), rel=1e-9)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.90)
    assert (low, high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert (p < 0.05) == (-margin < low and high < margin)  # equivalent at 5% <=> the 90% CI inside the margins


def test_tost_without_spread_and_bad_margins():
    assert tost([0.3, 0.3], [0.31, 0.31], 0.05)[2] == 0.0   # the difference is exactly 0.01: inside
    assert tost([0.3, 0.3], [0.4, 0.4], 0.05)[2] == 1.0     # exactly 0.1: outside
    assert tost([0.4, 0.4, 0.4], [0.4, 0.4], 0.05)[1:] == (pytest.approx(0.0, abs=1e-12), 0.0)
    with pytest.raises(ValueError, match="margin must be > 0"):
        tost([1.0, 2.0], [1.0, 2.0], 0.0)


def _rows():
    values = {"add": [0.70, 0.72, 0.71, 0.69], "concat": [0.71, 0.70, 0.72, 0.70]}
    return pd.DataFrame([{"data": "synthetic_contrast", "key_dim": k, "head_combine": combine, "seed": s,
                          "faith/attention/comprehensiveness": v, "faith/attention/tau_loo": v - 0.5,
                          "faith/final/adversarial_tv": 0.9 + v / 10}
                         for combine, vals in values.items() for s, (k, v) in enumerate(zip((1, 1, 2, 2), vals))])


def test_design_comparison_adds_tost_where_a_margin_is_set():
    runs = _rows()
    d = design_comparison(runs, pool_key_sizes=True, margins={"comprehensiveness": 0.05, "adversarial_tv": 0.001})
    d = d.set_index(["explainer", "metric"])
    add = runs[runs.head_combine == "add"]
    concat = runs[runs.head_combine == "concat"]
    r = d.loc[("attention", "comprehensiveness")]
    col = "faith/attention/comprehensiveness"
    assert r["margin"] == 0.05
    assert r["tost_p"] == pytest.approx(tost(add[col], concat[col], 0.05)[2]) and r["tost_p"] < 0.05
    adv = d.loc[("-", "adversarial_tv")]  # the end-of-fit search is compared too, at its own margin
    assert adv["difference"] == pytest.approx((add[col].mean() - concat[col].mean()) / 10)
    assert adv["margin"] == 0.001 and adv["tost_p"] > 0.05
    assert math.isnan(d.loc[("attention", "tau_loo"), "tost_p"])  # no margin fixed for it: no TOST
    assert "tost_p" not in design_comparison(runs, pool_key_sizes=True)  # no margins at all: Welch only


def _job(root, i, combine, key_dim, seed, comp, margins=None):
    d = root / str(i)
    d.mkdir(parents=True)
    model = {"embed_dim": 64, "num_heads": 4, "key_dim": key_dim, "value_dim": None, "head_combine": combine}
    metrics = {"test/acc": 0.95, "val/faith/attention/comprehensiveness": comp, "val/faith/uniform_acc_gap": 0.5}
    (d / "metrics.json").write_text(json.dumps({"config": {"data": "synthetic_contrast", "seed": seed,
                                                           "model": model}, "metrics": metrics}))
    if margins is not None:
        lines = "".join(f"    {k}: {v}\n" for k, v in margins.items())
        (d / "config_resolved.yaml").write_text(f"seed: {seed}\nreport:\n  equivalence_margins:\n{lines}")


def test_a_sweep_of_the_designs_at_their_default_key_sizes_writes_the_pooled_comparison(tmp_path):
    """model=baseline,identifiable at their defaults (key 16 and key 2): no key size has both designs, so
    there is no per-key-size row, but the pooled comparison is written (issue 32), with the TOST at the
    margins the runs' config carries."""
    sweep = tmp_path / "sweep"
    comps = {("concat", None): [0.60, 0.62, 0.61], ("add", 2): [0.61, 0.60, 0.63]}
    i = 0
    for (combine, key_dim), values in comps.items():
        for seed, c in enumerate(values, 1):
            _job(sweep, i, combine, key_dim, seed, c, margins={"comprehensiveness": 0.05})
            i += 1
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    md = (tmp_path / "out" / "faithfulness_designs.md").read_text()
    assert "comprehensiveness ±0.05" in md and "No key size was run with both designs" in md
    row = next(ln for ln in md.splitlines() if "| attention | comprehensiveness |" in ln)
    a, b = comps[("add", 2)], comps[("concat", None)]
    low, high, p = tost(a, b, 0.05)
    assert f"| all | attention | comprehensiveness | {np.mean(a):.3f} ± {np.std(a, ddof=1):.3f} |" in row
    assert f"| 0.05 | [{low:+.3f}, {high:+.3f}] | {p:.3g} | 3/3 |" in row
    csv = pd.read_csv(tmp_path / "out" / "faithfulness_designs.csv")
    assert set(csv["key_dim"].astype(str)) == {"all"}


def test_equivalence_margins_come_from_the_runs_and_must_agree(tmp_path):
    from identifiable_transformers.common.errors import UserError

    for i, m in enumerate(({"tau_loo": 0.1}, {"tau_loo": 0.1}, None)):
        _job(tmp_path, i, "add", 2, i, 0.5, margins=m)
    runs = pd.DataFrame({"run": ["0", "1", "2"], "_dir": [str(tmp_path / str(i)) for i in range(3)]})
    assert equivalence_margins(runs) == {"tau_loo": 0.1}
    _job(tmp_path, 3, "add", 2, 3, 0.5, margins={"tau_loo": 0.2})
    runs = pd.DataFrame({"run": ["0", "3"], "_dir": [str(tmp_path / "0"), str(tmp_path / "3")]})
    with pytest.raises(UserError, match="different equivalence margins"):
        equivalence_margins(runs)
    _job(tmp_path, 4, "add", 2, 4, 0.5, margins={"tau_loo": -1})
    with pytest.raises(UserError, match="margins > 0"):
        equivalence_margins(pd.DataFrame({"run": ["4"], "_dir": [str(tmp_path / "4")]}))


def test_welch_without_spread_is_decided_by_the_means():
    """Both designs constant: equal means give p = 1, different means p = 0 (not 1)."""
    from identifiable_transformers.report.designs import welch

    assert welch(np.array([0.5, 0.5]), np.array([0.5, 0.5, 0.5]))[2] == 1.0
    diff, half, p = welch(np.array([0.5, 0.5]), np.array([0.4, 0.4, 0.4]))
    assert (diff, half, p) == (pytest.approx(0.1), 0.0, 0.0)
    assert welch(np.array([0.4, 0.4, 0.4]), np.array([0.4, 0.4]))[2] == 1.0  # float noise is no spread


def test_faithfulness_table_counts_the_runs_of_any_metric():
    """'runs' is the most runs any metric has, not the count of the last metric (rationale_f1, logged by one run
    here)."""
    from identifiable_transformers.report.faithfulness import faithfulness_table

    rows = [{"data": "x", "head_combine": "add", "embed_dim": 64, "num_heads": 4, "key_dim": 2, "value_dim": 64,
             "seed": s, "faith/attention/comprehensiveness": 0.1 * s,
             "faith/attention/rationale_f1": 0.5 if s == 1 else np.nan} for s in (1, 2, 3)]
    table = faithfulness_table(pd.DataFrame(rows))
    assert list(table["runs"]) == [3]
    assert table["comprehensiveness_mean"].iloc[0] == pytest.approx(0.2)
