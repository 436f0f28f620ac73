"""The equal-shapes benchmark runs (tiny sizes; its figures are read by people, not asserted: no timed tests)."""

import os
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[1]


def test_bench_step_quick_runs_every_candidate_and_prints_the_ratios():
    out = run_cli([sys.executable, str(ROOT / "bench" / "bench_step.py"), "--quick", "--repeats", "1",
                   "--warmup", "1", "--steps", "1"], timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for name in ("ref_concat", "ours_concat", "ref_add", "ours_add"):
        assert f"\n{name} " in out.stdout
    assert "ours_concat            vs ref_concat" in out.stdout and "ours_add               vs ref_add" in out.stdout
    assert "of peak" in out.stdout


@pytest.mark.slow  # 20-30 s of benchmarking (issue 42: the default suite's 5-minute budget)
def test_bench_key_aware_quick_runs_both_paths_and_checks_the_goals():
    out = run_cli([sys.executable, str(ROOT / "bench" / "bench_key_aware.py"), "--quick", "--repeats", "1",
                   "--threads", "1"], timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "all goals met" in out.stdout or "goals missed" in out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.strip().startswith(("16 ", "32 "))]
    assert len(rows) == 4 and all(r[7] != "-" for r in rows)  # the dense path ran beside (it asserts equal counts)


def test_gpu_check_runs_its_checks_on_the_cpu():
    """The GPU check's comparisons (against a float64 per-head loop) hold on the CPU too: its logic is sound."""
    out = run_cli([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--cpu"], timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "30 passed, 0 failed" in out.stdout
    assert out.stdout.count("PASS ") == 30 and "FAIL" not in out.stdout


@pytest.mark.slow  # 20-30 s of benchmarking (issue 42: the default suite's 5-minute budget)
def test_bench_diagnostics_memory_prints_one_row_per_design_from_fresh_processes():
    out = run_cli([sys.executable, str(ROOT / "bench" / "bench_diagnostics.py"), "--memory", "--examples", "100"],
                  timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-3].split() == ["heads", "peak", "MB", "pass", "peak", "MB", "wall", "s", "cpu", "s"]
    for line, design in zip(lines[-2:], ("concat", "add")):
        name, peak, pass_peak, wall, cpu = line.split()
        assert name == design and float(peak) > float(pass_peak) > 0 and float(wall) > 0


def test_bench_probe_512_quick_prints_both_designs_and_equal_scores():
    out = run_cli([sys.executable, str(ROOT / "bench" / "bench_probe_512.py"), "--quick", "--repeats", "1"],
                  timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.startswith(("concat", "add"))}
    assert set(rows) == {"concat", "add"}
    for r in rows.values():
        assert float(r[4]) < 1e-4  # the width groups give the scores of the whole-width pass
        assert all(float(x) > 0 for x in r[1:4] + r[5:])
