"""The sweep report's user mistakes end with one ``Error:`` line and exit status 1; a run it cannot use is
a ``warning:`` line and the others go on; the failed jobs of a sweep are named."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from identifiable_transformers.report import failed_jobs, main

MODEL = {"embed_dim": 64, "num_heads": 4, "key_dim": 2, "value_dim": None, "head_combine": "add"}


def _job(sweep: Path, name: str, acc: float | None = 0.7, hydra: bool = True, **result) -> Path:
    """A job folder as train.py -m leaves it (``.hydra/``), with a metrics.json unless ``acc`` is None (failed)."""
    d = sweep / name
    d.mkdir(parents=True)
    if hydra:
        (d / ".hydra").mkdir()
        (d / ".hydra" / "config.yaml").write_text("seed: 1\n")
    if acc is not None:
        body = {"config": {"data": "rt_offline", "seed": int(name), "model": MODEL}, "metrics": {"test/acc": acc},
                **result}
        (d / "metrics.json").write_text(json.dumps({k: v for k, v in body.items() if v is not None}))
    return d


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), captured.err
    assert "Traceback" not in captured.out + captured.err
    return lines[0]


def test_a_missing_folder_is_an_error_and_is_not_created(tmp_path, capsys):
    missing = tmp_path / "no_such_sweep"
    assert main([str(missing)]) == 1
    assert _error_line(capsys) == (f"Error: {missing} does not exist: pass the directory of a finished sweep "
                                   "(e.g. logs/train/multiruns/<date>) or run")
    assert not missing.exists()


def test_a_file_given_as_the_sweep_is_an_error(tmp_path, capsys):
    (tmp_path / "f.txt").write_text("x")
    assert main([str(tmp_path / "f.txt")]) == 1
    assert "is a file, not a folder" in _error_line(capsys)


def test_a_folder_with_only_failed_jobs_is_an_error_that_counts_them(tmp_path, capsys):
    _job(tmp_path, "0", acc=None)
    _job(tmp_path, "1", acc=None)
    assert main([str(tmp_path)]) == 1
    assert _error_line(capsys) == (f"Error: no metrics.json under {tmp_path} (2 job folder(s) without one: failed or "
                                   "unfinished): pass the directory of a finished sweep")


def test_a_truncated_metrics_json_is_an_error_naming_the_file(tmp_path, capsys):
    _job(tmp_path, "0")
    bad = _job(tmp_path, "1") / "metrics.json"
    bad.write_text(bad.read_text()[:25])
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    line = _error_line(capsys)
    assert line.startswith(f"Error: {bad} is not valid JSON (") and "truncated or damaged" in line
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_out_naming_a_file_is_an_error(tmp_path, capsys, where):
    _job(tmp_path / "sweep", "0")
    (tmp_path / "taken").write_text("keep me")
    out = tmp_path / "taken" if where == "file" else tmp_path / "taken" / "sub"
    assert main([str(tmp_path / "sweep"), "--out", str(out)]) == 1
    line = _error_line(capsys)
    assert line.startswith(f"Error: --out={out} ")
    assert ("is a file, not a folder" if where == "file" else "cannot be created") in line
    assert (tmp_path / "taken").read_text() == "keep me"


def test_a_run_without_config_is_skipped_with_a_warning(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", acc=0.6)
    (_job(sweep, "1") / "metrics.json").write_text(json.dumps({"metrics": {"test/acc": 0.9}}))
    _job(sweep, "2", acc=0.8)
    assert main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"warning: 1: skipped, {sweep / '1' / 'metrics.json'} has no 'config'\n"
    runs = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(runs["run"]) == [0, 2] and list(runs["test_acc"]) == [0.6, 0.8]
    assert captured.out.splitlines()[-1].startswith("2 runs, 1 configurations -> ")


def test_only_runs_without_config_is_an_error(tmp_path, capsys):
    (_job(tmp_path, "0") / "metrics.json").write_text(json.dumps([1, 2]))  # not train.py's layout at all
    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("warning: 0: skipped, ") and "is not laid out as train.py writes it" in err[0]
    assert err[1:] == [f"Error: no run under {tmp_path} has a usable metrics.json (each was skipped, see the warnings)"]


def test_a_sweep_with_failed_jobs_names_them(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for name, acc in (("0", 0.7), ("1", None), ("2", 0.8), ("10", None)):
        _job(sweep, name, acc)
    _job(sweep, "3", acc=0.75, hydra=False)  # a run copied in by hand: no .hydra, still a run
    assert failed_jobs(sweep) == ["1", "10"]  # in job order
    assert main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "warning: 2 job(s) have no metrics.json (failed or unfinished), left out: 1, 10" in captured.err
    assert captured.out.splitlines()[-1].startswith("3 runs, 2 failed job(s) left out (1, 10), 1 configurations -> ")
    assert (tmp_path / "out" / "results.md").read_text().endswith(
        "\nFailed jobs (no metrics.json, left out): 1, 10\n")


def test_full_error_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        main([str(tmp_path / "missing")])


def test_the_command_line_prints_one_error_line_and_exits_1(tmp_path):
    src = Path(__file__).resolve().parents[1] / "src"
    proc = subprocess.run([sys.executable, "-m", "identifiable_transformers.report", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "HYDRA_FULL_ERROR": "", "PYTHONPATH": str(src)})
    assert proc.returncode == 1
    assert proc.stderr == f"Error: no metrics.json under {tmp_path}: pass the directory of a finished sweep\n"
