"""The factorial report (report/factorial.py): contrasts of four cell means against hand-computed values and
scipy's Welch test, TOST at the preset's margins, the range superiority test, and factorial.md's notes (per key size
outside the margin, head-room, the adversarial TV's ceiling) from faked run folders."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from identifiable_transformers.report import main
from identifiable_transformers.report.factorial import contrast, factorial_table, is_factorial, range_superiority

# Four cells (concat S, concat L, add S, add L), 3 seeds each, every cell's variance 0.01:
# means 0.6, 0.7, 0.6, 0.9.
CELLS = {("concat", 16): [0.5, 0.6, 0.7], ("concat", 64): [0.6, 0.7, 0.8],
         ("add", 16): [0.5, 0.6, 0.7], ("add", 64): [0.8, 0.9, 1.0]}


def test_a_two_cell_contrast_is_welchs_test():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 0.05, 7), rng.normal(0.55, 0.1, 11)
    est, se, dof = contrast([a, b], (1.0, -1.0))
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert est == pytest.approx(a.mean() - b.mean())
    assert est / se == pytest.approx(ref.statistic) and dof == pytest.approx(ref.df)


def test_contrasts_by_hand():
    """value_size = ((0.7 - 0.6) + (0.9 - 0.6)) / 2 = 0.2, head_combine = ((0.6 - 0.6) + (0.9 - 0.7)) / 2 = 0.1,
    interaction = (0.9 - 0.6) - (0.7 - 0.6) = 0.2. Equal variances s^2 = 0.01 and n = 3: the main effects' se is
    sqrt(4 * 0.25 * 0.01 / 3), the interaction's sqrt(4 * 0.01 / 3), and Welch-Satterthwaite's dof 4 (n - 1) = 8."""
    runs = _frame()
    t = factorial_table(runs, {"comprehensiveness": 0.3}).set_index("contrast")
    se_main, se_int = math.sqrt(0.01 / 3), math.sqrt(0.04 / 3)
    for name, est, se in (("value_size", 0.2, se_main), ("head_combine", 0.1, se_main), ("interaction", 0.2, se_int)):
        r = t.loc[name]
        assert (r["estimate"], r["se"], r["dof"]) == (pytest.approx(est), pytest.approx(se), pytest.approx(8))
        q = stats.t.ppf(0.975, 8)
        assert (r["ci95_low"], r["ci95_high"]) == (pytest.approx(est - q * se), pytest.approx(est + q * se))
        assert r["p"] == pytest.approx(2 * stats.t.sf(est / se, 8))
    assert (t.loc["value_size", ["concat_S", "concat_L", "add_S", "add_L"]].to_numpy(float)
            == pytest.approx([0.6, 0.7, 0.6, 0.9]))
    # TOST of value_size at 0.3: 90% CI 0.2 +- 1.8595 * 0.0577 = [0.093, 0.307] pokes out of +-0.3
    r = t.loc["value_size"]
    assert r["ci90_high"] == pytest.approx(0.2 + stats.t.ppf(0.95, 8) * se_main) and r["ci90_high"] > 0.3
    assert r["tost_p"] == pytest.approx(stats.t.cdf((0.2 - 0.3) / se_main, 8)) and r["tost_p"] > 0.05
    wide = factorial_table(runs, {"comprehensiveness": 0.31}).set_index("contrast").loc["value_size"]
    assert wide["tost_p"] < 0.05  # the CI's high end 0.307 is inside +-0.31


def test_only_a_full_factorial_is_one():
    runs = _frame()
    assert is_factorial(runs)
    three = runs[~((runs.head_combine == "add") & (runs.value_dim == 16))]
    assert not is_factorial(three) and factorial_table(three) is None


def test_range_spreads_superiority():
    """range_x_low/high pair into one spread; non-identifiable (16) minus identifiable (64) spreads, averaged over the
    head combinations: (0.2 + 0.3) / 2 - 0 = 0.25, one-sided p small; an equal spread is not shown larger."""
    runs = _frame()
    small = runs["value_dim"] == 16
    runs["ident/range_rationale_low"] = 0.5
    runs["ident/range_rationale_high"] = 0.5 + np.where(small, np.where(runs.head_combine == "add", 0.3, 0.2), 0.0)
    runs["ident/range_rationale_high"] += 0.01 * runs["seed"]  # spread among seeds
    runs["ident/range_equal"] = 0.1 + 0.01 * runs["seed"]
    r = range_superiority(runs).set_index("range")
    spread = r.loc["ident/range_rationale_spread"]
    assert spread["difference"] == pytest.approx(0.25) and spread["p_superiority"] < 1e-6
    assert spread["non_identifiable"] == pytest.approx(0.25 + 0.02) and spread["identifiable"] == pytest.approx(0.02)
    eq = r.loc["ident/range_equal"]
    assert eq["difference"] == pytest.approx(0.0, abs=1e-12) and eq["p_superiority"] == pytest.approx(0.5)


def _frame(key_dims=(2,)):
    return pd.DataFrame([{"data": "t", "key_dim": k, "head_combine": c, "value_dim": v, "seed": s,
                          "faith/attention/comprehensiveness": x}
                         for k in key_dims for (c, v), xs in CELLS.items() for s, x in enumerate(xs, 1)])


def _job(root, i, combine, value_dim, key_dim, seed, metrics, margins):
    d = root / str(i)
    d.mkdir(parents=True)
    model = {"embed_dim": 64, "num_heads": 4, "key_dim": key_dim, "value_dim": value_dim, "head_combine": combine}
    (d / "metrics.json").write_text(json.dumps({"config": {"data": "synthetic_contrast", "seed": seed,
                                                           "model": model}, "metrics": metrics}))
    lines = "".join(f"    {k}: {v}\n" for k, v in margins.items())
    (d / "config_resolved.yaml").write_text(f"seed: {seed}\nreport:\n  equivalence_margins:\n{lines}")


def test_the_report_writes_factorial_md_with_its_notes(tmp_path):
    """A faked factorial sweep at key sizes 2 and 8, 4 seeds: comprehensiveness equal in every cell at key 2, value
    size +0.25 at key 8 (its 90% CI far outside the 0.2 margin) and +0.125 pooled (90% CI about [0.07, 0.18]: inside),
    so key 8 is listed; AUPRC at 0.995 (head-room 0.005 < margin 0.01) and comprehensiveness' best arm at 0.85
    (0.15 < 0.2) flagged, test accuracy 0.95 (0.05 >= 0.01) not; every adversarial TV 1.000; a range spread
    0.3 larger in the value-16 arms. No faithfulness_designs.md: head_combine alone does not name the design."""
    margins = {"comprehensiveness": 0.2, "rationale_auprc": 0.01, "adversarial_tv": 0.05, "test_acc": 0.01}
    sweep, i = tmp_path / "sweep", 0
    for key_dim in (2, 8):
        for combine in ("concat", "add"):
            for value_dim in (16, 64):
                for seed in range(1, 5):
                    comp = 0.7 + 0.01 * seed + (0.25 if key_dim == 8 and value_dim == 64 else 0.0)
                    metrics = {"test/acc": 0.95, "val/faith/attention/comprehensiveness": comp,
                               "val/faith/attention/rationale_auprc": 0.9945 + 0.001 * (seed % 2),
                               "val/faith/final/adversarial_tv": 0.9999,
                               "val/ident/range_weight": (0.3 if value_dim == 16 else 0.0) + 0.01 * seed}
                    _job(sweep, i, combine, value_dim, key_dim, seed, metrics, margins)
                    i += 1
    out = tmp_path / "out"
    assert main([str(sweep), "--out", str(out), "--no-key-aware"]) == 0
    assert not (out / "faithfulness_designs.md").exists()
    md = (out / "factorial.md").read_text()
    csv = pd.read_csv(out / "factorial.csv")
    comp = csv[(csv.metric == "comprehensiveness") & (csv.contrast == "value_size")].set_index("key_dim")
    assert comp.loc["2", "estimate"] == pytest.approx(0.0, abs=1e-12)
    assert comp.loc["8", "estimate"] == pytest.approx(0.25) and comp.loc["all", "estimate"] == pytest.approx(0.125)
    assert comp.loc["all", "tost_p"] < 0.05 and comp.loc["8", "tost_p"] > 0.05 and comp.loc["2", "tost_p"] < 0.05
    assert "* synthetic_contrast, key_dim 8, attention comprehensiveness, value_size: +0.250" in md
    assert "the estimate itself lies outside" in md
    assert "**synthetic_contrast, attention rationale_auprc**: best arm 0.995, head-room 0.005 < margin 0.01." in md
    room = md.split("## Head-room")[1].split("##")[0]
    assert "attention comprehensiveness**: best arm 0.850, head-room 0.150 < margin 0.2." in room  # 0.7 + 0.025 + 0.125
    assert "test_acc" not in room  # 0.95: head-room 0.05 >= its margin 0.01, not flagged
    assert "**The adversarial TV is a ceiling**" in md
    assert "| synthetic_contrast | all | ident/range_weight | 0.3250 | 0.0250 | +0.300 |" in md


def test_the_pooled_within_and_per_key_outside_note():
    """Key 2: every cell 0.5 + 0.001 seed (no effect). Key 8: the value-64 cells 0.5 + 0.2 seed = 0.7, 0.9, 1.1, the
    others 0.5: value_size +0.4, se sqrt(2 * 0.25 * 0.04 / 3) = 0.082 on 4 dof, 90% CI [0.23, 0.57] leaves +-0.5
    (the estimate inside); head_combine and the interaction are 0 there, inside. Pooled, value_size is +0.2 with a
    90% CI of about [0.07, 0.33]: inside. Exactly key 8's value_size is listed."""
    from identifiable_transformers.report.factorial import per_key_outside

    runs = _frame(key_dims=(2, 8))
    big = (runs.key_dim == 8) & (runs.value_dim == 64)
    runs["faith/attention/comprehensiveness"] = np.where(big, 0.5 + 0.2 * runs.seed,
                                                         np.where(runs.key_dim == 2, 0.5 + 0.001 * runs.seed, 0.5))
    assert per_key_outside(factorial_table(runs, {"comprehensiveness": 1.0})).empty  # everything inside +-1
    t = factorial_table(runs, {"comprehensiveness": 0.5})
    rows = per_key_outside(t)
    assert list(zip(rows["key_dim"], rows["contrast"])) == [(8, "value_size")]
    r = rows.iloc[0]
    assert r["estimate"] == pytest.approx(0.4) and r["se"] == pytest.approx(math.sqrt(0.5 * 0.04 / 3))
