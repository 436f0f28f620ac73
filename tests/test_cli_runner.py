"""tests/cli_runner.py: a command served by the warm zygote ends exactly as the same command in a fresh
interpreter (``subprocess.run``, the reference) does: status, stdout, stderr, cwd, argv, sys.path."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
from cli_runner import BASE_ENV, run_cli, served

# Prints what a fresh interpreter would have set up, and whether it was forked by the zygote (its parent is not us).
SHOW = """
import os, sys
print("argv", sys.argv)
print("cwd", os.getcwd())
print("path", sys.path)
print("fresh", "identifiable_transformers" not in sys.modules)
import identifiable_transformers
print("imported from", identifiable_transformers.__file__)
print("stdin", sys.stdin.read() == "")
print("marker", os.environ.get("MARK_DIR"))
print("to stderr", file=sys.stderr)
"""

CASES = {
    "ok": "print('fine')",
    "no_newline": "import sys; sys.stdout.write('partial'); sys.stderr.write('also partial')",
    "exit_3": "raise SystemExit(3)",
    "exit_message": "import sys; sys.exit('Error: a message')",
    "uncaught": "def f():\n    raise ValueError('boom')\nprint('before')\nf()",
    "atexit": "import atexit; atexit.register(print, 'at exit'); print('main')",
    "show": SHOW,
    # what importing Lightning and torch puts in os.environ is there, as in a fresh interpreter
    "import_effects": "import os, lightning.pytorch; print([os.environ.get(k) for k in "
                      "('PYTORCH_NVML_BASED_CUDA_CHECK', 'TORCHINDUCTOR_CACHE_DIR')])",
}


def _both(tmp_path, code: str, *args: str, env: dict | None = None, module: bool = False):
    """(zygote, fresh): the same command run by run_cli and by subprocess.run."""
    (tmp_path / "pkg_extra").mkdir(exist_ok=True)
    (tmp_path / "pkg_extra" / "script_mod.py").write_text(textwrap.dedent(code))
    target = ["-m", "script_mod"] if module else [str(tmp_path / "pkg_extra" / "script_mod.py")]
    extra = str(tmp_path / "pkg_extra")  # twice, and an empty entry (the cwd): as the interpreter reads them
    env = {**BASE_ENV, "PYTHONPATH": os.pathsep.join([extra, "", extra, *sys.path]), **(env or {})}
    cmd = [sys.executable, *target, *args]
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    zygote = run_cli(cmd, cwd=cwd, env=env, timeout=120)
    fresh = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return zygote, fresh


@pytest.mark.parametrize("case", list(CASES))
def test_a_served_script_ends_as_in_a_fresh_interpreter(tmp_path, case):
    zygote, fresh = _both(tmp_path, CASES[case], "a b", "--x=1", env={"MARK_DIR": "m"})
    assert (zygote.returncode, zygote.stdout, zygote.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    expected = {"ok": 0, "no_newline": 0, "exit_3": 3, "exit_message": 1, "uncaught": 1, "atexit": 0, "show": 0,
                "import_effects": 0}
    assert zygote.returncode == expected[case]
    if case == "uncaught":  # the traceback starts in the script, as the interpreter prints it
        assert zygote.stderr.startswith(f'Traceback (most recent call last):\n  File "{tmp_path}/pkg_extra/')
        assert zygote.stderr.endswith("ValueError: boom\n") and zygote.stdout == "before\n"
    if case == "show":
        assert "fresh True" in zygote.stdout and "argv [" in zygote.stdout and "marker m" in zygote.stdout


def test_a_served_module_ends_as_in_a_fresh_interpreter(tmp_path):
    zygote, fresh = _both(tmp_path, SHOW, "arg", module=True)
    assert (zygote.returncode, zygote.stdout, zygote.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert f"cwd {tmp_path / 'cwd'}\n" in zygote.stdout and "fresh True" in zygote.stdout


def test_the_child_is_forked_from_a_warm_zygote_that_never_imported_our_package(tmp_path):
    code = ("import os, sys; print(os.getppid(), 'torch' in sys.modules, 'lightning.pytorch' in sys.modules, "
            "any(m.startswith('identifiable_transformers') for m in sys.modules))")
    zygote, fresh = _both(tmp_path, code)
    ppid, torch_warm, lightning_warm, ours = zygote.stdout.split()
    assert int(ppid) != os.getpid() and (torch_warm, lightning_warm, ours) == ("True", "True", "False")
    assert fresh.stdout.split() == [str(os.getpid()), "False", "False", "False"]


def test_a_child_killed_by_a_signal_gives_minus_the_signal(tmp_path):
    zygote, fresh = _both(tmp_path, "import os; print('dying', flush=True); os.kill(os.getpid(), 9)")
    assert zygote.returncode == fresh.returncode == -9
    assert zygote.stdout == fresh.stdout == "dying\n"


def test_a_timeout_kills_the_child_and_raises_as_subprocess_does(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time; print('started', flush=True); time.sleep(60)")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_cli([sys.executable, str(script)], cwd=tmp_path, env=BASE_ENV, timeout=3)
    assert time.monotonic() - start < 30 and e.value.output == b"started\n"  # bytes, as subprocess.run gives
    script.write_text("print('again')")
    assert run_cli([sys.executable, str(script)], cwd=tmp_path, env=BASE_ENV).stdout == "again\n"  # still serves


def test_an_environment_change_outside_the_allowlist_runs_a_real_subprocess(tmp_path):
    cmd = [sys.executable, str(tmp_path / "x.py")]
    assert served(cmd, {**BASE_ENV, "HYDRA_FULL_ERROR": "1", "KILL_AT": "3", "WANDB_SERVICE": "x"})
    for changed in ({**BASE_ENV, "HF_HUB_OFFLINE": "0"}, {**BASE_ENV, "OMP_NUM_THREADS": "7"},
                    {k: v for k, v in BASE_ENV.items() if k != "HF_HUB_OFFLINE"}, {**BASE_ENV, "HOME": "/x"}):
        assert not served(cmd, changed)
    zygote, fresh = _both(tmp_path, "import os, sys; print(os.getppid(), 'torch' in sys.modules)",
                          env={"HF_HOME": str(tmp_path / "hf")})
    assert zygote.stdout == fresh.stdout == f"{os.getpid()} False\n"  # both are children of this process
    assert not served([sys.executable, "-c", "pass"], BASE_ENV)  # -c and other flags: a real interpreter


@pytest.mark.parametrize("target", [["missing.py"], ["-m", "missing_module"]])
def test_a_missing_script_or_module_ends_as_in_a_fresh_interpreter(tmp_path, target):
    cmd = [sys.executable, *target]
    zygote = run_cli(cmd, cwd=tmp_path, env=BASE_ENV)
    fresh = subprocess.run(cmd, cwd=tmp_path, env=BASE_ENV, capture_output=True, text=True)
    assert (zygote.returncode, zygote.stdout, zygote.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert zygote.returncode in (1, 2) and "missing" in zygote.stderr
