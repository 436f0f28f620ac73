"""findings.csv/.md (report/findings.py): every number against an independent scipy computation, the verdict rule,
the could-not-fail flags, factorial.md's cells read back, the odd run beside a factorial, and the code line."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from identifiable_transformers.report import main
from identifiable_transformers.report.code_note import code_note
from identifiable_transformers.report.findings import design_findings, factorial_findings, verdict

RNG = np.random.default_rng(7)


def test_the_verdict_rule():
    assert verdict(0.049, -0.1, 0.1) == "equivalent"
    assert verdict(0.05, 0.01, 0.1) == "differs"  # TOST p not below 0.05: the 95% CI decides
    assert verdict(np.nan, -0.2, -0.01) == "differs"
    assert verdict(0.3, -0.01, 0.2) == "not shown"
    assert verdict(0.01, 0.01, 0.02) == "equivalent"  # inside a margin and different from 0: equivalence wins


def _designs(values: dict[str, np.ndarray], metric="faith/attention/comprehensiveness", key_dim=2) -> pd.DataFrame:
    return pd.DataFrame([{"data": "t", "key_dim": key_dim, "head_combine": c, "value_dim": 64 if c == "add" else 16,
                          "seed": i, metric: x, "run": f"{c}{i}"}
                         for c, xs in values.items() for i, x in enumerate(xs)])


def _welch_reference(a, b, margin):
    """scipy's Welch test, its CIs, and the TOST as two one-sided Welch tests of the shifted samples."""
    res = stats.ttest_ind(a, b, equal_var=False)
    ci95 = res.confidence_interval(0.95)
    ci90 = res.confidence_interval(0.90)
    lower = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater").pvalue
    upper = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less").pvalue
    return res.pvalue, ci95, ci90, max(lower, upper)


@pytest.mark.parametrize("shift", [-0.25, -0.02, 0.0, 0.03, 0.25])
def test_design_rows_equal_scipy(shift):
    a, b = RNG.normal(0.6 + shift, 0.03, 9), RNG.normal(0.6, 0.05, 11)
    t = design_findings(_designs({"add": a, "concat": b}), {"comprehensiveness": 0.2})
    r = t[(t["metric"] == "comprehensiveness")].iloc[0]
    p, ci95, ci90, tost_p = _welch_reference(a, b, 0.2)
    assert r["estimate"] == pytest.approx(a.mean() - b.mean())
    assert (r["ci95_low"], r["ci95_high"]) == (pytest.approx(ci95.low), pytest.approx(ci95.high))
    assert (r["ci90_low"], r["ci90_high"]) == (pytest.approx(ci90.low), pytest.approx(ci90.high))
    assert r["p"] == pytest.approx(p) and r["tost_p"] == pytest.approx(tost_p)
    expected = "equivalent" if tost_p < 0.05 else "differs" if ci95.low > 0 or ci95.high < 0 else "not shown"
    assert r["verdict"] == expected and r["could_fail"]
    if abs(shift) == 0.25:  # outside the margin either way: one one-sided test alone would call it equivalent
        assert r["verdict"] == "differs" and r["tost_p"] > 0.5


CELL_ORDER = (("concat", 16), ("concat", 64), ("add", 16), ("add", 64))


def _factorial(cells: dict[tuple, np.ndarray], metric="faith/attention/comprehensiveness") -> pd.DataFrame:
    return pd.DataFrame([{"data": "t", "key_dim": 2, "head_combine": c, "value_dim": v, "seed": i, metric: x,
                          "run": f"{c}{v}-{i}"} for (c, v), xs in cells.items() for i, x in enumerate(xs)])


def _contrast_reference(xs, w, margin):
    """A linear contrast of independent means by hand: Welch-Satterthwaite dof, scipy's t distribution."""
    m = np.array([x.mean() for x in xs])
    v = np.array([x.var(ddof=1) / len(x) for x in xs])
    est, se = float(w @ m), float(np.sqrt((w**2) @ v))
    dof = se**4 / sum((wi**2 * vi) ** 2 / (len(x) - 1) for wi, vi, x in zip(w, v, xs))
    q95, q90 = stats.t.ppf(0.975, dof), stats.t.ppf(0.95, dof)
    tost = max(stats.t.sf((est + margin) / se, dof), stats.t.cdf((est - margin) / se, dof))
    return est, (est - q95 * se, est + q95 * se), (est - q90 * se, est + q90 * se), 2 * stats.t.sf(abs(est / se), dof), tost


@pytest.mark.parametrize("effect", [-0.25, 0.0, 0.25])
def test_factorial_rows_equal_an_independent_contrast(effect):
    """The value-size effect is ``effect`` (L above S in both head combinations): at -0.25 and margin 0.2 the TOST's
    upper one-sided test alone would say "equivalent" (p ~ 1e-5); both together must not."""
    base = {cell: RNG.normal(0.6, 0.02, 10) for cell in CELL_ORDER}
    cells = {(c, v): x + (effect if v == 64 else 0.0) for (c, v), x in base.items()}
    t = factorial_findings(_factorial(cells), {"comprehensiveness": 0.2})
    xs = [cells[c] for c in CELL_ORDER]
    for name, w in (("value_size", [-0.5, 0.5, -0.5, 0.5]), ("head_combine", [-0.5, -0.5, 0.5, 0.5]),
                    ("interaction", [1.0, -1.0, -1.0, 1.0])):
        r = t[(t["contrast"] == name) & (t["metric"] == "comprehensiveness")].iloc[0]
        est, ci95, ci90, p, tost = _contrast_reference(xs, np.array(w), 0.2)
        assert r["estimate"] == pytest.approx(est)
        assert (r["ci95_low"], r["ci95_high"]) == pytest.approx(ci95)
        assert (r["ci90_low"], r["ci90_high"]) == pytest.approx(ci90)
        assert r["p"] == pytest.approx(p) and r["tost_p"] == pytest.approx(tost)
    vs = t[(t["contrast"] == "value_size") & (t["metric"] == "comprehensiveness")].iloc[0]
    assert vs["verdict"] == ("equivalent" if effect == 0 else "differs")
    if effect:
        assert vs["tost_p"] > 0.9


def test_could_not_fail_zero_variance_head_room_and_lengths(tmp_path):
    """A zero-variance arm; AUPRC at 0.996-0.999 against a 0.01 margin (no head-room); an identifiable fraction on
    probes all beyond the baseline's bound (16) and all within the identifiable encoder's (64)."""
    runs = _designs({"add": np.array([0.3, 0.3, 0.3]), "concat": np.array([0.2, 0.25, 0.3])})
    runs["faith/attention/rationale_auprc"] = [0.999, 0.998, 0.997, 0.996, 0.997, 0.998]
    runs["identifiable_frac"] = np.where(runs["head_combine"] == "add", 1.0, 0.0)
    for i, r in runs.iterrows():
        d = tmp_path / str(i) / "identifiability"
        d.mkdir(parents=True)
        bound = 64 if r["head_combine"] == "add" else 16
        (d / "probe.json").write_text(json.dumps({"lengths": [25, 40, 61], "bounds": {"head": bound}}))
    runs["_dir"] = [str(tmp_path / str(i)) for i in runs.index]
    t = design_findings(runs, {"comprehensiveness": 0.5, "rationale_auprc": 0.01}).set_index("metric")
    assert not t.loc["comprehensiveness", "could_fail"]
    assert "zero variance: every run of add is 0.3" in t.loc["comprehensiveness", "why_not"]
    assert not t.loc["rationale_auprc", "could_fail"] and "no head-room" in t.loc["rationale_auprc", "why_not"]
    why = t.loc["identifiable_frac", "why_not"]
    assert "add's probes (25-61 tokens) all within its identifiable length 64" in why
    assert "concat's probes (25-61 tokens) all beyond its identifiable length 16" in why
    # one probe on the other side of the bound: the fraction could have come out otherwise
    (tmp_path / "3" / "identifiability" / "probe.json").write_text(json.dumps({"lengths": [12, 40],
                                                                              "bounds": {"head": 16}}))
    t = design_findings(runs, {}).set_index("metric")
    assert "probe lengths" not in t.loc["identifiable_frac", "why_not"]


def _job(root, i, combine, value_dim, seed, metrics, margins, provenance=None, out_rank=None):
    d = root / str(i)
    d.mkdir(parents=True)
    model = {"embed_dim": 64, "num_heads": 4, "key_dim": 2, "value_dim": value_dim, "head_combine": combine,
             **({"out_rank": out_rank} if out_rank else {})}
    result = {"config": {"data": "synthetic_contrast", "seed": seed, "model": model},
              "metrics": {"test/acc": 0.9, **metrics}}
    if provenance:
        result["provenance"] = provenance
    (d / "metrics.json").write_text(json.dumps(result))
    lines = "".join(f"    {k}: {v}\n" for k, v in margins.items())
    (d / "config_resolved.yaml").write_text(f"seed: {seed}\nreport:\n  equivalence_margins:\n{lines}")


def _sweep(root, odd=False):
    """Three seeds per cell; cell means 0.60 / 0.65 / 0.70 / 0.90 (concat 16, concat 64, add 16, add 64), every
    cell a different spread, so a column shifted or swapped shows."""
    means = dict(zip(CELL_ORDER, (0.60, 0.65, 0.70, 0.90)))
    spreads = dict(zip(CELL_ORDER, (0.01, 0.02, 0.03, 0.04)))
    i, values = 0, {}
    for cell in CELL_ORDER:
        values[cell] = means[cell] + spreads[cell] * np.array([-1.0, 0.0, 1.0])
        for seed, x in enumerate(values[cell], 1):
            _job(root, i, cell[0], cell[1], seed, {"val/faith/attention/comprehensiveness": float(x)},
                 {"comprehensiveness": 0.3}, {"commit": "a" * 40 if seed < 3 else "b" * 40, "dirty": seed == 2})
            i += 1
    if odd:
        _job(root, i, "add", 32, 1, {"val/faith/attention/comprehensiveness": 0.5}, {"comprehensiveness": 0.3})
    return values


def _md_rows(text: str, header_start: str) -> list[dict]:
    lines = text.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith(header_start))
    head = [h.strip() for h in lines[at].strip("|").split("|")]
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(head, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def _interval(cell: str) -> tuple[float, float]:
    low, high = cell.strip("[]").split(",")
    return float(low), float(high)


def test_factorial_md_cells_read_back(tmp_path):
    """Each cell column holds its own arm's mean, and the 90% CI column the 90% interval (not the 95%)."""
    values = _sweep(tmp_path / "sweep")
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    rows = [r for r in _md_rows((tmp_path / "out" / "factorial.md").read_text(), "| data | key_dim |")
            if r["metric"] == "comprehensiveness"]
    names = dict(zip(("concat S", "concat L", "add S", "add L"), CELL_ORDER))
    xs = [values[c] for c in CELL_ORDER]
    weights = {"value_size": [-0.5, 0.5, -0.5, 0.5], "head_combine": [-0.5, -0.5, 0.5, 0.5],
               "interaction": [1.0, -1.0, -1.0, 1.0]}
    assert {r["contrast"] for r in rows} == set(weights)
    for r in rows:
        for column, cell in names.items():
            assert float(r[column]) == pytest.approx(values[cell].mean(), abs=5e-4), (column, r)
        est, ci95, ci90, p, tost = _contrast_reference(xs, np.array(weights[r["contrast"]]), 0.3)
        assert float(r["estimate"]) == pytest.approx(est, abs=5e-4)
        assert _interval(r["95% CI"]) == pytest.approx(ci95, abs=5e-4)
        assert _interval(r["90% CI"]) == pytest.approx(ci90, abs=5e-4)
        assert float(r["TOST p"]) == pytest.approx(tost, rel=1e-2)
    found = [r for r in _md_rows((tmp_path / "out" / "findings.md").read_text(), "| task |")
             if r["metric"] == "comprehensiveness"]
    assert len(found) == 3
    for r in found:
        est, ci95, ci90, p, tost = _contrast_reference(xs, np.array(weights[r["contrast"]]), 0.3)
        assert _interval(r["95% CI"]) == pytest.approx(ci95, abs=5e-4)
        assert _interval(r["90% CI"]) == pytest.approx(ci90, abs=5e-4)
        assert r["verdict"].split(" (")[0] == ("equivalent" if tost < 0.05 else "differs"
                                               if ci95[0] > 0 or ci95[1] < 0 else "not shown")


def test_an_odd_run_beside_the_factorial_is_named_and_left_out(tmp_path, capsys):
    _sweep(tmp_path / "sweep", odd=True)
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    err = capsys.readouterr().err
    assert "warning: 1 run(s) are not cells of the 2x2 factorial (synthetic_contrast: value_dim [16, 64])" in err
    assert "12 (synthetic_contrast, head_combine=add, value_dim=32, key_dim=2)" in err
    assert (tmp_path / "out" / "factorial.md").exists()
    assert not (tmp_path / "out" / "faithfulness_designs.md").exists()
    csv = pd.read_csv(tmp_path / "out" / "factorial.csv")
    assert set(csv["runs"]) == {"3/3/3/3"}  # the odd run is in no cell


def test_each_table_names_its_commits(tmp_path):
    _sweep(tmp_path / "sweep")
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    for name in ("results.md", "faithfulness.md", "factorial.md", "findings.md"):
        text = (tmp_path / "out" / name).read_text()
        assert ("**Mixed code**: this table's runs come from commits aaaaaaa (8 runs), bbbbbbb (4 runs); 4 from a "
                "tree with changed tracked files (dirty).") in text, name
    assert set(pd.read_csv(tmp_path / "out" / "results.csv")["commit"]) == {"a" * 40, "b" * 40}


def test_code_note_cases():
    one = pd.DataFrame({"commit": ["c" * 40] * 3, "dirty": [False] * 3})
    assert code_note(one) == "Code: commit ccccccc (3 runs)."
    assert code_note(pd.DataFrame({"x": [1, 2]})) == "Code: not recorded (2 runs from before metrics.json named its " \
                                                     "commit)."
    part = pd.DataFrame({"commit": ["c" * 40, None], "dirty": [None, None]})
    assert code_note(part) == ("**Mixed code**: this table's runs come from commit ccccccc (1 run); 1 whose tree state "
                               "is unknown, 1 with no recorded commit.")


def test_the_capped_rank_arm_has_its_own_contrasts_against_the_cells(tmp_path, capsys):
    """A fifth arm (concat/16 with model.out_rank=16) beside the 2x2: it is in no factorial cell, not warned about as
    odd, and its three contrasts (rank_cap, head_combine_at_rank, interaction_at_rank) equal an independent linear
    contrast of the five arms' means, in factorial.md, factorial_rank.csv and findings.md."""
    values = _sweep(tmp_path / "sweep")
    values["capped"] = 0.68 + 0.05 * np.array([-1.0, 0.0, 1.0])
    for seed, x in enumerate(values["capped"], 1):
        _job(tmp_path / "sweep", 12 + seed, "concat", 16, seed, {"val/faith/attention/comprehensiveness": float(x)},
             {"comprehensiveness": 0.3}, out_rank=16)
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    assert "not cells of the 2x2" not in capsys.readouterr().err
    assert set(pd.read_csv(tmp_path / "out" / "factorial.csv")["runs"]) == {"3/3/3/3"}
    xs = [values[c] for c in (*CELL_ORDER, "capped")]
    weights = {"rank_cap": [-1, 0, 0, 0, 1], "head_combine_at_rank": [0, 0, 1, 0, -1],
               "interaction_at_rank": [0, -1, -1, 1, 1]}
    csv = pd.read_csv(tmp_path / "out" / "factorial_rank.csv")
    csv = csv[csv["metric"] == "comprehensiveness"].set_index("contrast")
    assert set(csv.index) == set(weights) and set(csv["arm"]) == {"concat_r16"}
    found = {r["contrast"]: r for r in _md_rows((tmp_path / "out" / "findings.md").read_text(), "| task |")
             if r["metric"] == "comprehensiveness"}
    for name, w in weights.items():
        est, ci95, ci90, p, tost = _contrast_reference(xs, np.array(w, float), 0.3)
        assert csv.loc[name, "estimate"] == pytest.approx(est) and csv.loc[name, "p"] == pytest.approx(p)
        assert csv.loc[name, "tost_p"] == pytest.approx(tost)
        row = found[f"{name} (concat_r16)"]  # run at key size 2 only: listed with the pooled rows
        assert _interval(row["95% CI"]) == pytest.approx(ci95, abs=5e-4) and row["key_dim"] == "2"
    assert csv.loc["rank_cap", "estimate"] == pytest.approx(0.68 - 0.60)  # capped - concat/16
    assert csv.loc["head_combine_at_rank", "estimate"] == pytest.approx(0.70 - 0.68)  # add/16 - capped
    md = (tmp_path / "out" / "factorial.md").read_text()
    assert "## The capped-rank arm" in md and "| concat_r16 |" in md
