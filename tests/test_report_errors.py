"""The sweep report's user mistakes end with one ``Error:`` line and exit status 1; a run it cannot use is
a ``warning:`` line and the others go on; the failed jobs of a sweep are named."""

import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_runner import run_cli

from identifiable_transformers.report import failed_jobs, main

MODEL = {"embed_dim": 64, "num_heads": 4, "key_dim": 2, "value_dim": None, "head_combine": "add"}


def _job(sweep: Path, name: str, acc=0.7, hydra: bool = True, metrics_extra: dict | None = None,
         model: dict | None = None, **result) -> Path:
    """A job folder as train.py -m leaves it (``.hydra/``), with a metrics.json unless ``acc`` is None (failed)."""
    d = sweep / name
    d.mkdir(parents=True)
    if hydra:
        (d / ".hydra").mkdir()
        (d / ".hydra" / "config.yaml").write_text("seed: 1\n")
    if acc is not None:
        body = {"config": {"data": "rt_offline", "seed": int(name), "model": model or MODEL},
                "metrics": {"test/acc": acc, **(metrics_extra or {})}, **result}
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


def _multirun_yaml(sweep: Path, task: list[str], params: dict | None = None,
                   sweeper: str = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper") -> None:
    """The parts of Hydra's multirun.yaml the count reads: the sweeper, its params, the command line's overrides."""
    import yaml

    record = {"hydra": {"sweeper": {"_target_": sweeper, "max_batch_size": None, "params": params},
                        "overrides": {"hydra": ["hydra.mode=MULTIRUN"], "task": task}}, "seed": 42}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(record))


def test_a_sweep_with_jobs_missing_from_multirun_yaml_names_them(tmp_path, capsys):
    from identifiable_transformers.report.runs import expected_jobs

    sweep = tmp_path / "sweep"
    for name in ("0", "1", "2", "5"):
        _job(sweep, name, 0.7)
    _multirun_yaml(sweep, ["model.key_dim=2,4", "trainer=cpu"], params={"seed": "1,2,3,4"})  # 2 x 4 = 8 jobs
    assert expected_jobs(sweep) == 8
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    captured = capsys.readouterr()
    assert ("warning: multirun.yaml lists 8 jobs; 4 have no folder (never started, or removed), left out: 3, 4, 6, 7"
            in captured.err), captured.err
    assert captured.out.splitlines()[-1].startswith("4 runs, 4 missing job(s) (3, 4, 6, 7), ")
    assert "Missing jobs (listed in multirun.yaml, no folder): 3, 4, 6, 7" in (tmp_path / "out" / "results.md").read_text()


def test_jobs_are_counted_only_where_the_sweep_can_be(tmp_path):
    from identifiable_transformers.report.runs import expected_jobs

    assert expected_jobs(tmp_path) is None  # no multirun.yaml
    _multirun_yaml(tmp_path, ["model.key_dim=range(2,8,2)", "seed=1,2"])
    assert expected_jobs(tmp_path) == 3 * 2
    _multirun_yaml(tmp_path, ["model.key_dim=2"])
    assert expected_jobs(tmp_path) == 1
    # the command line's key_dim=2 replaces the preset's sweep of it (hydra.sweeper.params), as the sweeper does
    _multirun_yaml(tmp_path, ["model.key_dim=2"], params={"model.key_dim": "2,8", "seed": "1,2,3"})
    assert expected_jobs(tmp_path) == 3
    _multirun_yaml(tmp_path, ["seed=1,2"], sweeper="hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper")
    assert expected_jobs(tmp_path) is None  # its trial count, not a grid


def test_full_error_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        main([str(tmp_path / "missing")])


def test_the_command_line_prints_one_error_line_and_exits_1(tmp_path):
    src = Path(__file__).resolve().parents[1] / "src"
    proc = run_cli([sys.executable, "-m", "identifiable_transformers.report", str(tmp_path)],
                   timeout=120, cwd=tmp_path,
                   env={**os.environ, "HYDRA_FULL_ERROR": "", "PYTHONPATH": str(src)})
    assert proc.returncode == 1
    assert proc.stderr == f"Error: no metrics.json under {tmp_path}: pass the directory of a finished sweep\n"


# ------------------------------------------------------------------ damaged run files, second reports (issue 32)
def _faith_sweep(sweep: Path, n: int = 3) -> list[Path]:
    """n runs of one configuration, each with faithfulness metrics and an explanations.json of two probe examples."""
    dirs = []
    for seed in range(n):
        d = _job(sweep, str(seed), metrics_extra={"val/faith/attention/comprehensiveness": 0.1 * (seed + 1)})
        (d / "identifiability").mkdir()
        (d / "identifiability" / "explanations.json").write_text(json.dumps(
            {"indices": [4, 24], "lengths": [3, 4], "scores": {"attention": [[0, 1, 1 + seed], [0, 2, 1, seed]]}}))
        dirs.append(d)
    return dirs


def _seed_agreement_pairs(out: Path) -> int:
    return int(pd.read_csv(out / "seed_agreement.csv")["pairs"].iloc[0])


DAMAGED_EXPLANATIONS = {
    "truncated": (lambda text: text[:30], "is not valid JSON ("),
    "a list": (lambda text: "[1, 2]", "is not laid out as train.py writes it (is a JSON list, not an object)"),
    "no scores": (lambda text: json.dumps({"indices": [4], "lengths": [3]}), "(has no 'scores')"),
    "rows missing": (lambda text: json.dumps({"indices": [4, 24], "lengths": [3, 4],
                                              "scores": {"attention": [[0, 1, 1]]}}),
                     "'scores'['attention'] does not hold one list per probe example (2)"),
    "negative attention": (lambda text: text.replace("[0, 2, 1, 1]", "[0, 2, -1, 1]"),
                           "(attention scores of probe example 24 are negative: not a distribution)"),
}


@pytest.mark.parametrize("case", list(DAMAGED_EXPLANATIONS))
def test_a_damaged_explanations_json_leaves_its_run_out_of_the_seed_agreement(tmp_path, capsys, case):
    damage, says = DAMAGED_EXPLANATIONS[case]
    dirs = _faith_sweep(tmp_path / "sweep")
    bad = dirs[1] / "identifiability" / "explanations.json"
    bad.write_text(damage(bad.read_text()))
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: 1: left out of the seed agreement, {bad} "), err
    assert says in err[0] and err[0].endswith("; rerun that job to rewrite it")
    assert _seed_agreement_pairs(tmp_path / "out") == 1  # runs 0 and 2 only: one pair (three runs: three)
    assert list(pd.read_csv(tmp_path / "out" / "results.csv")["run"]) == [0, 1, 2]  # its other results stay


def test_undamaged_explanations_give_every_pair(tmp_path, capsys):
    _faith_sweep(tmp_path / "sweep")
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    assert capsys.readouterr().err == ""
    assert _seed_agreement_pairs(tmp_path / "out") == 3


def _key_aware_json(d: Path, alternative: int) -> Path:
    path = d / "identifiability" / "key_aware.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"targets": [16], "lengths": [16], "alternative_dim": [[[alternative, 0]]],
                                "key_agnostic_dim": [[[0, 0]]], "tangent_dim": [[[1, 1]]], "margin": [[[20.0, None]]]}))  # resolved (>= 10)
    return path


@pytest.mark.parametrize("damage, says", [
    (lambda text: text[:40], "is not valid JSON ("),
    (lambda text: json.dumps({"lengths": [16]}), "'alternative_dim' is not a list of [layer][head] numbers"),
    (lambda text: text.replace('"lengths": [16]', '"lengths": "16"'), "'lengths' is not a list of whole numbers"),
])
def test_a_damaged_key_aware_json_leaves_its_run_out_of_the_key_aware_table(tmp_path, capsys, damage, says):
    sweep = tmp_path / "sweep"
    good, bad = _key_aware_json(_job(sweep, "0"), 2), _key_aware_json(_job(sweep, "1"), 4)
    bad.write_text(damage(bad.read_text()))
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: 1: left out of the key-aware table, {bad} "), err
    assert says in err[0] and err[0].endswith("; move it away and rerun the report to recount it")
    table = pd.read_csv(tmp_path / "out" / "key_aware.csv")
    assert list(table["runs"]) == [1] and list(table["alternative_dim_mean"]) == [1.0]  # run 0's mean over heads
    assert good.is_file() and bad.is_file()  # nothing deleted


@pytest.mark.parametrize("value", ["0.7", "high", True, [0.7]])
def test_a_metric_that_is_not_a_number_skips_its_run(tmp_path, capsys, value):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", acc=0.6)
    bad = _job(sweep, "1", acc=value) / "metrics.json"
    _job(sweep, "2", acc=0.8)
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (f"warning: 1: skipped, {bad} is not laid out as train.py writes it "
                            f"(metrics['test/acc']={value!r} is not a number)\n")
    runs = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(runs["run"]) == [0, 2] and list(runs["test_acc"]) == [0.6, 0.8]


def test_a_second_report_into_the_same_folder_is_refused(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", acc=0.6)
    assert main([str(sweep), "--no-key-aware"]) == 0  # into the sweep folder itself
    first = (sweep / "results.csv").read_text()
    _job(sweep, "1", acc=0.9)
    capsys.readouterr()
    assert main([str(sweep), "--no-key-aware"]) == 1
    assert _error_line(capsys) == (f"Error: {sweep} already holds a report (results.md, results.csv): pass --out to "
                                   "write this one elsewhere, or --overwrite to replace it")
    assert (sweep / "results.csv").read_text() == first  # untouched
    assert main([str(sweep), "--no-key-aware", "--out", str(tmp_path / "second")]) == 0
    assert list(pd.read_csv(tmp_path / "second" / "results.csv")["run"]) == [0, 1]
    assert main([str(sweep), "--no-key-aware", "--overwrite"]) == 0
    assert list(pd.read_csv(sweep / "results.csv")["run"]) == [0, 1]


def test_no_design_comparison_is_said_not_silent(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    faith = {"val/faith/attention/comprehensiveness": 0.2}
    _job(sweep, "0", metrics_extra=faith)
    _job(sweep, "1", metrics_extra=faith, model={**MODEL, "head_combine": "concat"})
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-key-aware"]) == 0
    assert not (tmp_path / "out" / "faithfulness_designs.md").exists()
    assert ("note: no faithfulness_designs.md: no dataset and key size has two runs of each design (identifiable "
            "and baseline)") in capsys.readouterr().out.splitlines()


# ------------------------------------------------------------------------------ default key-aware lengths
def _run_dir(tmp_path: Path, name: str, probe: dict | None = None, max_length: int | None = None) -> str:
    d = tmp_path / name
    (d / "identifiability").mkdir(parents=True)
    if probe is not None:
        (d / "identifiability" / "probe.json").write_text(json.dumps(probe))
    if max_length is not None:
        (d / "config_resolved.yaml").write_text(f"data:\n  name: x\n  max_length: {max_length}\n")
    return str(d)


def test_default_key_aware_lengths_come_from_the_data(tmp_path):
    from identifiable_transformers.report import KEY_AWARE_LENGTHS, default_key_aware_lengths

    def lengths(*dirs):
        return default_key_aware_lengths(pd.DataFrame({"_dir": list(dirs)}))[0]

    # the probe spans the eligible lengths: with none too long, its longest is the data's longest (57 here)
    exact = _run_dir(tmp_path, "a", {"lengths": [3, 20, 57], "num_too_long": 0}, max_length=128)
    assert lengths(exact) == (8, 14, 57)  # 57, 57/4 rounded, 57/16 raised to 8
    # examples too long for the probe: only the data's max_length (examples are cut to it) is known
    capped = _run_dir(tmp_path, "b", {"lengths": [3, 130], "num_too_long": 40}, max_length=512)
    assert lengths(capped) == (32, 128, 512)
    assert lengths(exact, capped) == (8, 14, 57)  # every length reached by an example of every run's data
    assert lengths(_run_dir(tmp_path, "c", {"lengths": [2, 5], "num_too_long": 0})) == (5,)  # shorter than 8
    assert lengths(_run_dir(tmp_path, "d")) == KEY_AWARE_LENGTHS  # nothing recorded: the fixed default
    (Path(exact) / "identifiability" / "probe.json").write_text("{trunc")  # damaged: fall back on max_length
    assert lengths(exact) == (8, 32, 128)


def test_default_key_aware_lengths_keep_the_lengths_every_run_was_counted_at(tmp_path):
    from identifiable_transformers.report import default_key_aware_lengths

    probe = {"lengths": [3, 57], "num_too_long": 0}
    dirs = [_run_dir(tmp_path, name, probe) for name in "ab"]
    for d in dirs:
        _key_aware_json(Path(d), 1)  # counted at [16] by an earlier report
    assert default_key_aware_lengths(pd.DataFrame({"_dir": dirs})) == ((16,), "the lengths every run was counted "
                                                                               "at before")
    dirs.append(_run_dir(tmp_path, "c", probe))  # a run not counted yet: lengths from the data again
    assert default_key_aware_lengths(pd.DataFrame({"_dir": dirs}))[0] == (8, 14, 57)
