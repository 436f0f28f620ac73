"""`python train.py --help` lists every option a user can pick: each config group's files, the sweep presets of
multirun_sweeps/ (a search path, which Hydra's own list leaves out) and the launchers."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_group_option_sweep_preset_and_launcher():
    proc = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()

    def options(group: str) -> set[str]:
        line = next((ln for ln in lines if ln.startswith(f"{group}: ")), None)
        assert line is not None, f"--help has no line for {group}"
        return {o.strip() for o in line.split(": ", 1)[1].split(",")}

    for group in ("model", "data", "trainer", "logger", "callbacks", "debug", "experiment", "hparams_search"):
        on_disk = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
        assert on_disk and on_disk <= options(group), (group, on_disk - options(group))
    presets = {p.stem for p in (ROOT / "multirun_sweeps" / "sweep").glob("*.yaml")}
    assert presets and options("sweep") == presets, "conf/hydra/default.yaml: the help template's sweep line must list multirun_sweeps/sweep/"
    launchers = {p.stem for p in (ROOT / "conf" / "hydra" / "launcher").glob("*.yaml")}
    assert launchers and launchers <= options("hydra/launcher")
