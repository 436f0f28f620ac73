"""bench_gpu.py --cpu: the smoke version of the GPU benchmark runs every section but the sweep, and its sync
check passes (its figures are read by people, not asserted: no timed tests)."""

import sys
from pathlib import Path

from cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[1]


def test_bench_gpu_cpu_smoke_runs_every_section(cache_dir):
    out = run_cli([sys.executable, str(ROOT / "bench" / "bench_gpu.py"), "--cpu", "--cache-dir", str(cache_dir)],
                  timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for line in ("PASS concat eager", "PASS add    eager", "sync check: all passed", "identifiable / torch_layer",
                 "baseline / torch_layer", "DataLoader, eager", "of its training epoch", "end of fit:",
                 "skipped on the CPU"):
        assert line in out.stdout, line
