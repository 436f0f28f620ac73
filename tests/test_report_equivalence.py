"""The report's equivalence-range table from runs' val/ident/range_* metrics (known answers)."""

import json
import statistics

from identifiable_transformers.report import main


def _job(root, i, combine, seed, metrics):
    d = root / str(i)
    d.mkdir(parents=True)
    model = {"embed_dim": 64, "num_heads": 4, "key_dim": 2, "value_dim": None, "head_combine": combine}
    (d / "metrics.json").write_text(json.dumps({"config": {"data": "synthetic_contrast", "seed": seed, "model": model},
                                                "metrics": {"test/acc": 0.9, **metrics}, "best_model_path": None}))


def test_equivalence_table_is_mean_and_std_per_configuration(tmp_path):
    sweep = tmp_path / "sweep"
    spreads = {"concat": [0.10, 0.30, 0.20], "add": [0.0, 0.0, 0.0]}
    i = 0
    for combine, values in spreads.items():
        for seed, s in enumerate(values):
            _job(sweep, i, combine, seed, {"val/ident/range_rationale": s, "val/ident/range_top": s / 2,
                                           "val/ident/range_comprehensiveness_best": 0.5 + s,
                                           "val/ident/len_le_17/range_top": 0.0})
            i += 1
    _job(sweep, i, "concat", 9, {})  # a run without the callback (callbacks.equivalence=null): left out of the means
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    md = (tmp_path / "out" / "equivalence.md").read_text().splitlines()
    row = next(line for line in md if "| concat |" in line)
    v = spreads["concat"]
    assert f"{statistics.mean(v):.4f} ± {statistics.stdev(v):.4f}" in row
    assert f"{statistics.mean(v) / 2:.4f} ± {statistics.stdev(v) / 2:.4f}" in row
    assert f"{0.5 + statistics.mean(v):.4f}" in row and row.rstrip(" |").endswith("3")  # runs: 3
    assert "0.0000 ± 0.0000" in next(line for line in md if "| add |" in line)
    assert "range_top" in (tmp_path / "out" / "lengths.md").read_text()
