"""The report's per-length table (lengths.md / lengths.csv) against means and standard deviations by hand."""

import json
import statistics

import pandas as pd
import pytest

from identifiable_transformers.report import main


def _job(root, i, combine, seed, metrics):
    d = root / str(i)
    d.mkdir(parents=True)
    model = {"embed_dim": 64, "num_heads": 4, "key_dim": 2, "value_dim": None, "head_combine": combine}
    (d / "metrics.json").write_text(json.dumps({"config": {"data": "imdb_offline", "seed": seed, "model": model},
                                                "metrics": {"test/acc": 0.8, **metrics}}))


def _bins(seed, combine):
    """Per-bin metrics of one run: identifiability in bins 17, 130 and 512; faithfulness up to 130 only (the CPU
    default stops it at 2d + 2), and a bin-130 comprehensiveness that only the add runs log."""
    frac = {17: 1.0, 130: 0.5 + 0.1 * seed, 512: 0.1 * seed} if combine == "add" else {17: 1.0, 130: 0.0, 512: 0.0}
    m = {}
    for n, f in frac.items():
        m[f"val/ident/len_le_{n}/identifiable_frac"] = f
        m[f"val/ident/len_le_{n}/probe_count"] = {17: 4, 130: 20, 512: 64}[n]
        m[f"val/ident/len_le_{n}/null_dim"] = n / 2 + seed
    m["val/faith/attention/len_le_17/comprehensiveness"] = 0.2 * seed
    m["val/faith/effective/len_le_17/comprehensiveness"] = 0.3 * seed
    if combine == "add":
        m["val/faith/attention/len_le_130/comprehensiveness"] = 0.25 * seed
    return m


def test_length_table_is_mean_and_std_per_configuration_and_bin(tmp_path):
    sweep = tmp_path / "sweep"
    i = 0
    for combine in ("add", "concat"):
        for seed in (1, 2, 3):
            _job(sweep, i, combine, seed, _bins(seed, combine))
            i += 1
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    table = pd.read_csv(tmp_path / "out" / "lengths.csv")
    assert list(table["length_le"]) == [17, 130, 512, 17, 130, 512]  # per configuration, shortest bin first
    add = table[table["head_combine"] == "add"].set_index("length_le")
    for n, values in {130: [0.6, 0.7, 0.8], 512: [0.1, 0.2, 0.3]}.items():
        assert add.loc[n, "identifiable_frac_mean"] == pytest.approx(statistics.mean(values), abs=1e-12)
        assert add.loc[n, "identifiable_frac_std"] == pytest.approx(statistics.stdev(values), abs=1e-12)
    assert add.loc[512, "null_dim_mean"] == 256 + 2 and add.loc[512, "probe_count_mean"] == 64
    assert add.loc[17, "effective_comprehensiveness_mean"] == pytest.approx(0.3 * 2, abs=1e-12)
    assert add.loc[130, "attention_comprehensiveness_mean"] == pytest.approx(0.25 * 2, abs=1e-12)
    assert pd.isna(add.loc[512, "attention_comprehensiveness_mean"])  # not logged past 130: n/a, not 0
    concat = table[table["head_combine"] == "concat"].set_index("length_le")
    assert pd.isna(concat.loc[130, "attention_comprehensiveness_mean"])  # only the add runs logged it
    assert set(table["runs"]) == {3}
    md = (tmp_path / "out" / "lengths.md").read_text().splitlines()
    assert md[0].startswith("| data | head_combine | embed_dim | num_heads | key_dim | value_dim | length_le | ")
    row = next(line for line in md if "| add |" in line and "| 512 |" in line)
    assert f"{0.2:.3f} ± {statistics.stdev([0.1, 0.2, 0.3]):.3f}" in row and "n/a" in row


def test_no_length_table_without_per_bin_metrics(tmp_path):
    _job(tmp_path / "sweep", 0, "add", 1, {"val/ident/identifiable_frac": 1.0})
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    assert not (tmp_path / "out" / "lengths.md").exists() and (tmp_path / "out" / "results.md").exists()
