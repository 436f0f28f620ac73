"""The report's explainer_agreement table: Kendall tau-b between attention and value zeroing / ALTI on the same
probe examples (tokens after <cls>), mean over the probe per run, mean ± std over a configuration's runs. The
reference is SciPy's tau-b, example by example."""

import json
import statistics

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau

from identifiable_transformers.report import main
from identifiable_transformers.report.explainer_agreement import run_agreement


def _run(root, i, seed, scores):
    d = root / str(i)
    (d / "identifiability").mkdir(parents=True)
    model = {"embed_dim": 64, "num_heads": 4, "key_dim": 2, "value_dim": None, "head_combine": "add"}
    (d / "metrics.json").write_text(json.dumps({"config": {"data": "rt_offline", "seed": seed, "model": model},
                                                "metrics": {"test/acc": 0.7, "val/faith/attention/comprehensiveness":
                                                            0.5}, "best_model_path": None}))
    lengths = [len(s) for s in scores["attention"]]
    (d / "identifiability" / "explanations.json").write_text(json.dumps(
        {"indices": list(range(len(lengths))), "lengths": lengths, "tokens": [["w"] * n for n in lengths],
         "predicted": [0] * len(lengths), "scores": scores}))


def _by_hand(a, b):
    taus = [kendalltau(x[1:], y[1:], variant="b").statistic for x, y in zip(a, b)]
    return float(np.nanmean(taus))


def test_agreement_is_scipys_tau_b_averaged_over_the_probe_then_the_seeds(tmp_path):
    rng = np.random.default_rng(0)
    runs = []
    for seed in (1, 2, 3):
        lengths = (6, 9, 4)
        scores = {e: [rng.random(n).round(1).tolist() for n in lengths]  # rounded: ties, as real maps have
                  for e in ("attention", "effective", "value_zeroing", "alti")}
        scores["alti"][2] = [0.5] * 4  # constant: tau-b undefined, the example is left out
        runs.append(scores)
        _run(tmp_path / "sweep", seed, seed, scores)
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    table = pd.read_csv(tmp_path / "out" / "explainer_agreement.csv")
    assert list(table["pair"]) == ["attention ~ value_zeroing", "attention ~ alti", "effective ~ value_zeroing",
                                   "effective ~ alti"]
    for a, b in (("attention", "value_zeroing"), ("effective", "alti")):
        per_run = [_by_hand(s[a], s[b]) for s in runs]
        assert [run_agreement(json.loads((tmp_path / "sweep" / str(i) / "identifiability" / "explanations.json")
                                         .read_text()), a, b) for i in (1, 2, 3)] == pytest.approx(per_run)
        row = table[table["pair"] == f"{a} ~ {b}"].iloc[0]
        assert row["tau_mean"] == pytest.approx(statistics.mean(per_run))
        assert row["tau_std"] == pytest.approx(statistics.stdev(per_run))
        assert row["runs"] == 3
    assert "attention ~ alti" in (tmp_path / "out" / "explainer_agreement.md").read_text()


def test_a_missing_explainer_gives_no_row(tmp_path):
    _run(tmp_path / "sweep", 0, 1, {"attention": [[0.0, 0.1, 0.5, 0.2]], "loo": [[0.0, 0.3, 0.1, 0.2]]})
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    assert not (tmp_path / "out" / "explainer_agreement.csv").exists()
