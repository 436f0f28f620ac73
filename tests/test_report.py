import json
import math
import statistics

import pandas as pd
import pytest
import torch

from identifiable_transformers.diagnostics.maths import key_aware_alternative_dims
from identifiable_transformers.models import TransformerClassifier
from identifiable_transformers.report import js_divergence, key_aware_counts, main


def _job(root, i, combine, key_dim, seed, acc, frac):
    d = root / str(i)
    d.mkdir(parents=True)
    model = {"embed_dim": 64, "num_heads": 4, "key_dim": key_dim, "value_dim": None, "head_combine": combine}
    metrics = {"test/acc": acc, "test/f1": acc - 0.01, "val/acc_best": acc + 0.01, "val/ident/identifiable_frac": frac}
    (d / "metrics.json").write_text(json.dumps({"config": {"data": "rt_offline", "seed": seed, "model": model},
                                                "metrics": metrics, "best_epoch": 3, "runtime_s": 1.0}))


def test_report_aggregates_mean_and_std_per_configuration(tmp_path):
    accs = {("concat", None): [0.70, 0.72, 0.74], ("add", 2): [0.71, 0.75, 0.73]}
    i = 0
    for (combine, key_dim), values in accs.items():
        for seed, acc in enumerate(values):
            _job(tmp_path / "sweep", i, combine, key_dim, seed, acc, 0.5 if combine == "add" else 0.1)
            i += 1
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "results.md").read_text()
    # concat's key_dim=None resolves to d/h = 16; add keeps value_dim = d
    add_row = next(line for line in md.splitlines() if "| add |" in line)
    concat_row = next(line for line in md.splitlines() if "| concat |" in line)
    assert "| 2 | 64 |" in add_row and "| 16 | 16 |" in concat_row
    for row, values in ((add_row, accs[("add", 2)]), (concat_row, accs[("concat", None)])):
        assert f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}" in row
    assert len((tmp_path / "out" / "results.csv").read_text().splitlines()) == 7
    assert (tmp_path / "out" / "test_acc_vs_key_dim.png").stat().st_size > 0


def test_report_on_empty_directory_names_the_problem(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"Error: no metrics.json under {tmp_path}: pass the directory of a finished sweep\n"


def _entropy(p):
    return -sum(x * math.log2(x) for x in p if x > 0)


def _jsd_by_hand(p, q):
    """JSD = H((p + q) / 2) - (H(p) + H(q)) / 2, in bits, on normalised p, q."""
    p, q = [x / sum(p) for x in p], [x / sum(q) for x in q]
    return _entropy([(a + b) / 2 for a, b in zip(p, q)]) - (_entropy(p) + _entropy(q)) / 2


def _faith_job(root, i, combine, key_dim, seed, faith, explanations=None):
    d = root / str(i)
    (d / "identifiability").mkdir(parents=True)
    model = {"embed_dim": 64, "num_heads": 4, "key_dim": key_dim, "value_dim": None, "head_combine": combine}
    (d / "metrics.json").write_text(json.dumps({"config": {"data": "rt_offline", "seed": seed, "model": model},
                                                "metrics": {"test/acc": 0.7, **faith}, "best_model_path": None}))
    if explanations is not None:
        (d / "identifiability" / "explanations.json").write_text(json.dumps(explanations))


def _expl(examples):
    """examples: {probe index: attention scores with <cls> first}"""
    idx = list(examples)
    return {"indices": idx, "lengths": [len(examples[i]) for i in idx], "tokens": [["w"] * len(examples[i]) for i in idx],
            "predicted": [0] * len(idx), "scores": {"attention": [examples[i] for i in idx]}}


def test_report_faithfulness_table_and_seed_agreement(tmp_path):
    sweep = tmp_path / "sweep"
    comp = {"add": [0.30, 0.40, 0.20], "concat": [0.10, 0.12, 0.14]}
    # seed agreement of the add runs; examples matched by index, <cls> dropped, scores renormalised
    expl = {1: _expl({5: [0, 1, 1], 7: [0, 1, 1, 2]}),
            2: _expl({7: [0, 1, 1, 2], 5: [0, 3, 0]}),
            3: _expl({5: [0, 2, 2], 9: [0, 1, 0]})}
    i = 0
    for combine, values in comp.items():
        for seed, c in zip((1, 2, 3), values):
            faith = {"val/faith/attention/comprehensiveness": c, "val/faith/attention/sufficiency": 0.1,
                     "val/faith/random/comprehensiveness": c / 2, "val/faith/uniform_acc_gap": 0.01 * seed,
                     "val/faith/final/integrated_gradients/comprehensiveness": c + 1}
            _faith_job(sweep, i, combine, 2, seed, faith, expl[seed] if combine == "add" else None)
            i += 1
    assert main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    md = (out / "faithfulness.md").read_text().splitlines()
    row = next(line for line in md if "| add |" in line and "| attention |" in line)
    assert f"{statistics.mean(comp['add']):.4f} ± {statistics.stdev(comp['add']):.4f}" in row
    row = next(line for line in md if "| concat |" in line and "| random |" in line)
    half = [c / 2 for c in comp["concat"]]
    assert f"{statistics.mean(half):.4f} ± {statistics.stdev(half):.4f}" in row
    row = next(line for line in md if "| add |" in line and "| integrated_gradients |" in line)
    assert f"{statistics.mean(comp['add']) + 1:.4f}" in row
    gap = next(line for line in (out / "results.md").read_text().splitlines() if "| add |" in line)
    assert f"{statistics.mean([0.01, 0.02, 0.03]):.4f} ± {statistics.stdev([0.01, 0.02, 0.03]):.4f}" in gap

    agreement = pd.read_csv(out / "seed_agreement.csv")
    assert list(agreement["head_combine"]) == ["add"] and list(agreement["explainer"]) == ["attention"]
    j = _jsd_by_hand([1, 1], [3, 0])  # = H(3/4, 1/4) - 1/2
    assert j == pytest.approx(0.311278, abs=1e-6)
    pairs = [(j + 0.0) / 2, 0.0, j]  # seeds (1,2): examples 5 and 7; (1,3): 5; (2,3): 5
    a = agreement.iloc[0]
    assert a["jsd_seeds_mean"] == pytest.approx(statistics.mean(pairs))
    assert a["jsd_seeds_std"] == pytest.approx(statistics.stdev(pairs))
    assert (a["pairs"], a["examples"]) == (3, 2)
    # tau-b is undefined on example 5 (seeds 1 and 3 give constant scores) and 1 on example 7 (seeds 1, 2 agree)
    assert a["tau_seeds_mean"] == pytest.approx(1.0)
    to_uniform = [_jsd_by_hand(p, [1] * len(p)) for p in ([1, 1], [1, 1, 2], [1, 1, 2], [3, 0], [2, 2], [1, 0])]
    assert a["jsd_uniform_mean"] == pytest.approx(statistics.mean(to_uniform))
    assert "jsd_seeds" in (out / "seed_agreement.md").read_text()


def test_js_divergence_closed_forms():
    assert js_divergence([1, 0], [0, 1]) == pytest.approx(1.0)  # disjoint supports: 1 bit
    assert js_divergence([2, 2], [1, 1]) == pytest.approx(0.0)
    assert js_divergence([1, 1], [3, 0]) == pytest.approx(_jsd_by_hand([1, 1], [1, 0]))


def test_key_aware_counts_match_the_library_and_are_tabulated(tmp_path):
    torch.manual_seed(0)
    model = TransformerClassifier(40, 2, embed_dim=8, num_heads=2, key_dim=4, positional="sinusoidal").eval()
    ids = torch.randint(4, 40, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 7:] = False
    ids[1, 7:] = 0
    ours = key_aware_counts(model, ids, mask)
    ref = key_aware_alternative_dims(model, ids, mask)
    for k in ("alternative_dim", "key_agnostic_dim", "tangent_dim"):
        assert ours[k] == ref[k].tolist()
    # concat d_v = 4, d_k = 4: generic count max(0, 2n d_k - d_k^2 - d_k - n d_v) below n(n - 1 - d_v)
    assert ours["alternative_dim"][0][0] == [2 * 9 * 4 - 16 - 4 - 9 * 4] * 2
    assert ours["key_agnostic_dim"][1][0] == [7 * (7 - 5)] * 2

    sweep = tmp_path / "sweep"
    for i, (seed, alt) in enumerate(((1, [[3, 5]]), (2, [[7, 9]]))):
        _faith_job(sweep, i, "concat", 8, seed, {"val/faith/attention/tau_loo": 0.5})
        (sweep / str(i) / "identifiability" / "key_aware.json").write_text(json.dumps(
            {"lengths": [20], "alternative_dim": [alt], "key_agnostic_dim": [[[60, 60]]], "tangent_dim": [[[1, 1]]]}))
    _faith_job(sweep, 2, "concat", 8, 3, {"val/faith/attention/tau_loo": 0.5})  # no checkpoint, no file: a note
    assert main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    row = next(line for line in (tmp_path / "out" / "key_aware.md").read_text().splitlines() if "| concat |" in line)
    assert f"{statistics.mean([4, 8]):.1f} ± {statistics.stdev([4, 8]):.1f}" in row
    assert "60.0 ± 0.0" in row and row.rstrip(" |").endswith("2")


def test_key_aware_table_is_per_example_length(tmp_path):
    """Two seeds of one configuration, each with a probe example of length 12 and one of length 20: every
    row averages the seeds' head means at its own length, never over both lengths."""
    from identifiable_transformers.report import GROUP, key_aware_table

    config = {"data": "rt_offline", "head_combine": "concat", "embed_dim": 8, "num_heads": 2, "key_dim": 4,
              "value_dim": 4}
    counts = {  # seed -> per example (n = 12, n = 20): [layer][head] counts
        1: {"alternative_dim": [[[2, 4]], [[10, 12]]], "key_agnostic_dim": [[[0, 0]], [[40, 40]]],
            "tangent_dim": [[[1, 1]], [[3, 3]]]},
        2: {"alternative_dim": [[[6, 6]], [[20, 22]]], "key_agnostic_dim": [[[0, 2]], [[44, 44]]],
            "tangent_dim": [[[1, 1]], [[5, 5]]]},
    }
    rows = []
    for seed, ka in counts.items():
        d = tmp_path / str(seed) / "identifiability"
        d.mkdir(parents=True)
        # the 20-token example first: rows follow the lengths, not the order of the examples
        (d / "key_aware.json").write_text(json.dumps({"lengths": [20, 12], **{k: v[::-1] for k, v in ka.items()}}))
        rows.append({**config, "seed": seed, "run": str(seed), "_dir": str(d.parent)})
    table = key_aware_table(pd.DataFrame(rows)).set_index("n")
    assert list(table.index) == [12, 20] and list(table["runs"]) == [2, 2]
    assert table[GROUP].to_dict("records") == [config, config]
    expected = {  # per seed: the mean over layers and heads at that length
        (12, "alternative_dim"): [3, 6], (20, "alternative_dim"): [11, 21],
        (12, "key_agnostic_dim"): [0, 1], (20, "key_agnostic_dim"): [40, 44],
        (12, "tangent_dim"): [1, 1], (20, "tangent_dim"): [3, 5],
    }
    for (n, key), per_seed in expected.items():
        assert table.loc[n, f"{key}_mean"] == pytest.approx(statistics.mean(per_seed)), (n, key)
        assert table.loc[n, f"{key}_std"] == pytest.approx(statistics.stdev(per_seed)), (n, key)


def test_key_aware_lengths_random_heads_and_margins_are_tabulated(tmp_path, capsys):
    """Hand-made counts of two configurations at n = 16, 64, 256: the identifiable length is the longest
    n before the first alternative; matched random heads get their own; a bad --key-aware-lengths is refused."""
    from identifiable_transformers.report import key_aware_lengths, key_aware_table

    config = {"data": "imdb_offline", "head_combine": "add", "embed_dim": 64, "num_heads": 2, "value_dim": 64}
    rows = []
    counts = {2: ([[[0, 0]], [[0, 0]], [[0, 0]]], [[[0, 0]], [[0, 0]], [[0, 3]]]),  # d_k = 2: none trained
              64: ([[[0, 0]], [[0, 5]], [[9, 9]]], [[[0, 0]], [[4, 4]], [[8, 8]]])}
    for key_dim, (alt, rnd) in counts.items():
        d = tmp_path / str(key_dim) / "identifiability"
        d.mkdir(parents=True)
        margin = [[[1e6, None]], [[3.0, 1e5]], [[2e4, 2e4]]]
        d.joinpath("key_aware.json").write_text(json.dumps({
            "targets": [16, 64, 256], "lengths": [16, 64, 256], "alternative_dim": alt, "random_alternative_dim": rnd,
            "key_agnostic_dim": [[[0, 0]]] * 3, "tangent_dim": [[[1, 1]]] * 3, "margin": margin}))
        rows.append({**config, "key_dim": key_dim, "seed": 1, "run": str(key_dim), "_dir": str(d.parent)})
    table = key_aware_table(pd.DataFrame(rows))
    t64 = table[table["key_dim"] == 64].set_index("n")
    # margin 3.0 < UNRESOLVED_MARGIN: head 0 at n = 64 is unresolved, left out of the share and the mean
    assert list(t64["identifiable_heads"]) == [1.0, 0.0, 0.0]
    assert list(t64["unresolved_heads"]) == [0.0, 0.5, 0.0]
    assert list(t64["alternative_dim_mean"]) == [0.0, 5.0, 9.0]
    assert list(t64["random_alternative_dim_mean"]) == [0.0, 4.0, 8.0]
    assert list(t64["margin_min"]) == [1e6, 3.0, 2e4]
    lengths = key_aware_lengths(table).set_index("key_dim")
    # d_k = 2: no alternative anywhere, but n = 64 is unresolved, so only 16 is established
    assert lengths.loc[2, "identifiable_length"] == 16 and lengths.loc[2, "random_identifiable_length"] == 64
    assert lengths.loc[2, "unresolved_lengths"] == "64"
    assert lengths.loc[64, "identifiable_length"] == 16 and lengths.loc[64, "random_identifiable_length"] == 16

    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path), "--key-aware-lengths", "16,abc"])
    assert exit_.value.code == 1 and "Error: argument --key-aware-lengths" in capsys.readouterr().err


def test_design_comparison_is_a_welch_test_per_key_size():
    from scipy import stats

    from identifiable_transformers.report.designs import design_comparison

    add, concat = [0.70, 0.74, 0.72], [0.60, 0.61, 0.65]
    rows = [{"data": "synthetic_order", "key_dim": 2, "head_combine": combine, "seed": s,
             "faith/attention/comprehensiveness": v, "uniform_acc_gap": 0.5}
            for combine, vals in (("add", add), ("concat", concat)) for s, v in enumerate(vals)]
    d = design_comparison(pd.DataFrame(rows)).set_index(["explainer", "metric"])
    r = d.loc[("attention", "comprehensiveness")]
    assert r["difference"] == pytest.approx(statistics.mean(add) - statistics.mean(concat))
    assert r["welch_p"] == pytest.approx(stats.ttest_ind(add, concat, equal_var=False).pvalue)
    ci = stats.ttest_ind(add, concat, equal_var=False).confidence_interval(0.95)
    assert (r["ci95_low"], r["ci95_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.loc[("-", "uniform_acc_gap"), "difference"] == 0.0 and d.loc[("-", "uniform_acc_gap"), "welch_p"] == 1.0


def test_design_comparison_pools_key_sizes_into_one_welch_test_per_dataset():
    from scipy import stats

    from identifiable_transformers.report.designs import design_comparison

    values = {("add", 1): [0.70, 0.74, 0.72], ("add", 64): [0.50, 0.52, 0.49],
              ("concat", 1): [0.60, 0.61, 0.65], ("concat", 64): [0.55, 0.58, 0.54]}
    rows = [{"data": "imdb_offline", "key_dim": k, "head_combine": combine, "seed": s, "test_acc": 0.8 + v / 10,
             "faith/attention/comprehensiveness": v}
            for (combine, k), vals in values.items() for s, v in enumerate(vals)]
    d = design_comparison(pd.DataFrame(rows), pool_key_sizes=True).set_index(["explainer", "metric"])
    assert set(d["key_dim"]) == {"all"} and set(d["seeds"]) == {"6/6"}
    add, concat = values[("add", 1)] + values[("add", 64)], values[("concat", 1)] + values[("concat", 64)]
    r = d.loc[("attention", "comprehensiveness")]
    assert r["welch_p"] == pytest.approx(stats.ttest_ind(add, concat, equal_var=False).pvalue)
    assert (r["identifiable_std"], r["baseline_std"]) == (pytest.approx(statistics.stdev(add)),
                                                          pytest.approx(statistics.stdev(concat)))
    acc = d.loc[("-", "test_acc")]  # per-run scalars are compared too
    assert acc["difference"] == pytest.approx((statistics.mean(add) - statistics.mean(concat)) / 10)
    assert len(design_comparison(pd.DataFrame(rows))) == 2 * 2  # per key size: 2 key sizes x 2 metrics
