"""The report's statistics on hand-made runs whose answers are known (report/faithfulness.py).

* Welch's test: two designs with zero spread and different means differ for certain (p = 0, a CI of
  zero width at the difference); where both have a spread, p is scipy's Welch p.
* The faithfulness table's ``runs``: how many runs logged any metric of that explainer, whichever
  metric it is (plausibility is only logged on data with rationales, and comes last).
"""

from __future__ import annotations

import statistics

import pandas as pd
import pytest
from scipy import stats

from identifiable_transformers.report import faithfulness_table
from identifiable_transformers.report.designs import design_comparison

BASE = {"data": "rt_offline", "embed_dim": 64, "num_heads": 4, "key_dim": 2}


def _runs(values: dict[str, list[float]], column: str = "faith/attention/comprehensiveness") -> pd.DataFrame:
    return pd.DataFrame([{**BASE, "head_combine": combine, "value_dim": 64 if combine == "add" else 16, "seed": s,
                          column: v}
                         for combine, vals in values.items() for s, v in enumerate(vals)])


def test_two_designs_without_spread_and_different_means_differ_with_p_zero():
    # binary fractions, so that both variances are exactly 0 in floating point
    d = design_comparison(_runs({"add": [0.5, 0.5, 0.5], "concat": [0.75, 0.75, 0.75]})).iloc[0]
    assert d["difference"] == -0.25
    assert d["welch_p"] == 0.0
    assert d["ci95_low"] == -0.25 and d["ci95_high"] == -0.25
    assert d["identifiable_std"] == 0.0 and d["baseline_std"] == 0.0


def test_two_designs_without_spread_and_equal_means_do_not_differ():
    d = design_comparison(_runs({"add": [0.5, 0.5], "concat": [0.5, 0.5]})).iloc[0]
    assert d["difference"] == 0.0 and d["welch_p"] == 1.0


@pytest.mark.filterwarnings("ignore:Precision loss occurred")  # scipy, on the constant sample
def test_one_design_without_spread_gets_scipys_welch_p():
    add, concat = [0.5, 0.5, 0.5], [0.6, 0.7, 0.65]
    d = design_comparison(_runs({"add": add, "concat": concat})).iloc[0]
    assert d["welch_p"] == pytest.approx(stats.ttest_ind(add, concat, equal_var=False).pvalue)
    assert d["difference"] == pytest.approx(statistics.mean(add) - statistics.mean(concat))


def test_the_runs_column_counts_runs_that_logged_any_metric():
    runs = _runs({"add": [0.3, 0.4, 0.2], "concat": [0.1, 0.2]})
    runs["faith/attention/sufficiency"] = 0.1
    # plausibility comes last in the table's metric order; one add run logged it, no concat run did
    runs["faith/attention/rationale_f1"] = [0.9, None, None, None, None]
    table = faithfulness_table(runs).set_index("head_combine")
    assert table.loc["add", "runs"] == 3 and table.loc["concat", "runs"] == 2
    assert table.loc["add", "comprehensiveness_mean"] == pytest.approx(0.3)
    assert table.loc["add", "rationale_f1_mean"] == pytest.approx(0.9)


def test_the_runs_column_without_any_plausibility_metric():
    # data without rationales: no rationale_* column at all
    table = faithfulness_table(_runs({"add": [0.3, 0.4, 0.2], "concat": [0.1, 0.2]})).set_index("head_combine")
    assert table.loc["add", "runs"] == 3 and table.loc["concat", "runs"] == 2
