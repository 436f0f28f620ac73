"""run_cli(cmd, cwd=..., env=..., timeout=...): ``subprocess.run(cmd, capture_output=True, text=True)`` for
``python <script> args...`` and ``python -m <module> args...``, served by a forked child of one warm Python process.

Why: every ``train.py``/``analyze.py`` a test starts spends ~8 CPU-seconds importing torch, Lightning,
torchmetrics and transformers before it reads its first argument. Here one "zygote" per pytest worker imports
those THIRD-PARTY libraries once and then forks a child per command; the child sets up what a fresh interpreter
would have (cwd, environment, argv, sys.path, fds 0/1/2), runs the script as ``__main__`` and goes through
normal interpreter shutdown (atexit handlers run, stdio is flushed). Our own package is never imported by the
zygote, so each child imports ``identifiable_transformers`` fresh, as a real run does.

Fidelity: libraries read some environment variables when they are imported (HF_*, WANDB_*, OMP_NUM_THREADS,
HOME...), and the zygote imported them under its own environment. So a command whose environment differs from
the zygote's in anything but ``ENV_ALLOWED`` (read at run time only, by Hydra or by our tests' plugins) runs as a
real ``subprocess.run`` instead. What the zygote's imports put in os.environ (Lightning sets
PYTORCH_NVML_BASED_CUDA_CHECK, torch TORCHINDUCTOR_CACHE_DIR) is in every child's environment, as it is in a
fresh interpreter that imports them (our scripts all do). Tests of signals and process groups keep using
``subprocess`` directly.

``python tests/cli_runner.py --serve`` is the zygote: JSON requests on stdin, one line per event on stdout.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# Variables a command may change without leaving the zygote: none of them is read at import time by a library.
ENV_ALLOWED = frozenset({
    "PYTHONPATH",  # the child's sys.path is rebuilt from the request's PYTHONPATH
    "HYDRA_FULL_ERROR",  # read by Hydra when a job fails
    "PYTEST_CURRENT_TEST",  # set by pytest during each test
    "MARK_DIR", "KILL_AT",  # invented by our tests' plugins, read when they run
    # Left in this process's environment by the tests that train in it (Lightning's seed_everything and
    # deterministic mode); read when a run seeds or calls cuBLAS, never at import.
    "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG",
})
# W&B is not among the warm modules (the zygote checks it never imported it): a child that imports wandb reads
# its WANDB_* variables then, as a fresh interpreter does. (Tests that log to W&B in this process leave
# WANDB_SERVICE behind.)
ENV_ALLOWED_PREFIXES = ("WANDB_",)

# What the zygote imports before it forks: the third-party libraries our scripts import, heaviest first.
# Never identifiable_transformers (or anything that imports it).
WARM_MODULES = (
    "torch", "lightning.pytorch", "torchmetrics", "transformers", "tokenizers", "scipy.signal", "pandas",
    "pyarrow", "datasets", "matplotlib", "hydra", "hydra._internal.utils", "hydra.core.config_store", "omegaconf",
)


# ---------------------------------------------------------------------------------------------------- the client


class _Zygote:
    """The warm process of this pytest worker, started on first use with this module's import-time environment."""

    def __init__(self) -> None:
        self.env = dict(BASE_ENV)
        self.folder = Path(tempfile.mkdtemp(prefix="zygote-"))
        self.log = open(self.folder / "zygote.log", "wb")  # noqa: SIM115 - open for the zygote's lifetime
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=self.env, cwd=self.folder)
        self.count = 0
        ready = self._line(timeout=300)
        if ready.get("event") != "ready":
            raise RuntimeError(f"the zygote did not start: {ready}")
        # What its imports set in os.environ (Lightning: PYTORCH_NVML_BASED_CUDA_CHECK; torch: the inductor's
        # cache folder): a fresh interpreter's imports set them too.
        self.import_effects: dict[str, str | None] = ready["import_effects"]
        atexit.register(self.close)

    def _line(self, timeout: float | None) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return {}
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote ended; its log: {(self.folder / 'zygote.log').read_text()[-2000:]}")
        return json.loads(line)

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float | None):
        self.count += 1
        out, err = self.folder / f"{self.count}.out", self.folder / f"{self.count}.err"
        request = {"argv": argv, "cwd": cwd, "env": env, "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        pid = self._line(timeout=60)["pid"]
        done = self._line(timeout=timeout)
        timed_out = not done
        if timed_out:  # what subprocess.run does on a timeout: kill the child, then raise
            os.kill(pid, signal.SIGKILL)
            done = self._line(timeout=60)
        stdout, stderr = out.read_bytes(), err.read_bytes()
        out.unlink()
        err.unlink()
        if timed_out:  # bytes, as subprocess.run gives them on a timeout even with text=True
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(argv, done["returncode"], _text(stdout), _text(stderr))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _text(data: bytes) -> str:
    """What text=True gives: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


BASE_ENV = dict(os.environ)  # after conftest.py set its defaults, before any test changes the environment
_zygote: _Zygote | None = None


def _zygote_started() -> _Zygote:
    global _zygote
    if _zygote is None:
        _zygote = _Zygote()
    return _zygote


def env_changes(env: dict[str, str], import_effects: dict[str, str | None]) -> set[str]:
    """The variables of ``env`` that the zygote's imports did not see: those that differ from its environment,
    except a variable its imports set, where ``env`` may also leave it unset (the import sets it again)."""
    changed = {k for k in env.keys() | BASE_ENV.keys() if env.get(k) != BASE_ENV.get(k)}
    return {k for k in changed if k not in import_effects or k in env and env[k] != import_effects[k]}


def served(cmd: list[str], env: dict[str, str]) -> bool:
    """Whether the zygote can run ``cmd`` under ``env`` as a fresh interpreter would: ``python <script>`` or
    ``python -m <module>``, with no environment change outside ``ENV_ALLOWED``."""
    if len(cmd) < 2 or cmd[0] != sys.executable or cmd[1].startswith("-") and cmd[1] != "-m":
        return False
    changed = {k for k in env_changes(env, _zygote_started().import_effects) - ENV_ALLOWED
               if not k.startswith(ENV_ALLOWED_PREFIXES)}
    if changed and os.environ.get("CLI_RUNNER_TRACE"):  # why a test did not use the zygote
        with open(os.environ["CLI_RUNNER_TRACE"], "a") as trace:
            trace.write(f"{os.environ.get('PYTEST_CURRENT_TEST')}: {sorted(changed)}\n")
    return not changed


def run_cli(cmd: list[str], *, cwd, env: dict[str, str] | None = None, timeout: float | None = None):
    """``subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, through the
    zygote where ``served`` says so. ``env`` None means this process's environment, as for subprocess."""
    env = dict(os.environ if env is None else env)
    cmd = [str(c) for c in cmd]
    if not served(cmd, env):
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return _zygote_started().run(cmd[1:], str(cwd), env, timeout)


# ---------------------------------------------------------------------------------------------------- the zygote


def _serve() -> dict:
    """Read requests until stdin ends; fork a child for each and report its pid and exit status. Returns the
    request in the child (the parent never returns: it exits when stdin ends)."""
    import importlib

    before = dict(os.environ)
    for name in WARM_MODULES:
        importlib.import_module(name)
    import_effects = {k: os.environ.get(k) for k in os.environ.keys() | before.keys()
                      if os.environ.get(k) != before.get(k)}
    warm = {m.split(".")[0] for m in sys.modules}
    assert "identifiable_transformers" not in warm and "wandb" not in warm, "see ENV_ALLOWED_PREFIXES"
    # sys.path after the script's folder and PYTHONPATH: the standard library (its zip first) and site-packages
    stdlib_zip = f"python{sys.version_info.major}{sys.version_info.minor}.zip"
    tail = sys.path[next(i for i, p in enumerate(sys.path) if p.endswith(stdlib_zip)):]
    import gc

    # The warm objects out of the collector's sight: a child's collections and its shutdown would otherwise walk
    # them all, copying every page it shares with the zygote (1.7 s per child, against 0.4 s; see gc.freeze).
    gc.freeze()
    reply = sys.stdout
    reply.write(json.dumps({"event": "ready", "import_effects": import_effects}) + "\n")
    reply.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            request["tail"] = tail
            request["env"] = {**{k: v for k, v in import_effects.items() if v is not None}, **request["env"]}
            for k in [k for k, v in import_effects.items() if v is None]:  # unset by an import: unset again
                request["env"].pop(k, None)
            return request
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        reply.flush()
    sys.exit(0)


def _become(request: dict) -> tuple[str, str]:
    """In the forked child: what ``python <argv>`` would have set up. Returns (how, what): ("path", script) or
    ("module", name)."""
    import importlib

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    how, what, rest = ("module", argv[1], argv[2:]) if argv[0] == "-m" else ("path", argv[0], argv[1:])
    first = os.getcwd() if how == "module" else os.path.dirname(os.path.realpath(what))  # as the interpreter
    pythonpath = request["env"].get("PYTHONPATH", "")
    pythonpath = [os.path.abspath(p) for p in pythonpath.split(os.pathsep)] if pythonpath else []
    sys.path[:] = [first, *dict.fromkeys([*pythonpath, *request["tail"]])]  # site.py drops repeated entries
    sys.argv[:] = [what if how == "path" else "-m", *rest]
    importlib.invalidate_caches()
    for fd, (path, mode) in enumerate([(os.devnull, os.O_RDONLY), (request["stdout"], os.O_WRONLY | os.O_CREAT),
                                       (request["stderr"], os.O_WRONLY | os.O_CREAT)]):
        opened = os.open(path, mode | (os.O_TRUNC if fd else 0), 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    # A fresh interpreter draws fresh seeds; the children of one zygote would all share its draws.
    import random

    import numpy
    import torch

    random.seed()
    numpy.random.seed()
    torch.seed()
    return how, what


def _run_as_main(how: str, what: str) -> None:
    """Run the script or module as ``__main__``. An uncaught exception is printed as the interpreter prints it
    (through sys.excepthook, without this file's and runpy's frames) and ends the process with status 1; a
    SystemExit is left to the interpreter. Either way the process then shuts down normally."""
    import importlib.util
    import runpy

    if how == "path" and not os.path.exists(what):  # what the interpreter says before it runs anything
        sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(what)!r}: [Errno 2] No such file or "
                         "directory\n")
        raise SystemExit(2)
    if how == "module" and importlib.util.find_spec(what) is None:
        sys.stderr.write(f"{sys.executable}: No module named {what}\n")
        raise SystemExit(1)
    try:
        if how == "path":
            runpy.run_path(what, run_name="__main__")
        else:
            runpy.run_module(what, run_name="__main__", alter_sys=True)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next
        e.with_traceback(tb or e.__traceback__)  # the interpreter prints the exception's own __traceback__
        sys.excepthook(type(e), e, e.__traceback__)
        raise SystemExit(1) from None


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _run_as_main(*_become(_serve()))
