import json
import statistics

import pytest

from identifiable_transformers.report import main


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


def test_report_on_empty_directory_names_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.json"):
        main([str(tmp_path)])
