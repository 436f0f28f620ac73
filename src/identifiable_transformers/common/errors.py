"""Entry scripts end a user mistake with one short message and exit status 1; a bug keeps its traceback.

A *user mistake* is a :class:`UserError`, or a ``ValueError`` / ``FileNotFoundError`` / ``ConnectionError``
raised by the project's own checks (the ``raise`` is in this package or in the entry script): their messages
name the key and the fix. The same types raised inside torch, Lightning or any other library are bugs (or
at least not ours to explain) and keep their traceback. ``HYDRA_FULL_ERROR=1`` shows every traceback.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the package, not common/
_INPUT_ERRORS = (ValueError, FileNotFoundError, ConnectionError)  # ConnectionError: data.DataUnavailableError


class UserError(Exception):
    """A mistake in the user's input (config value, path, environment) that its message explains."""


class ConfigError(UserError, ValueError):
    """A config value of the wrong type or an impossible one, found before any work starts."""


class Interrupted(SystemExit):
    """A run stopped by a signal (SIGTERM from a scheduler, Ctrl-C): exit status ``128 + signal``, and one
    message saying what was kept and how to go on (resume, or run again). A ``SystemExit``, so that nothing on
    the way (Hydra's job runner, ``except Exception``) swallows it; an entry script decorated with
    :func:`exit_on_user_error` prints :attr:`message`."""

    def __init__(self, signum: int, message: str):
        super().__init__(128 + int(signum))
        self.signum, self.message = int(signum), message

    def __str__(self) -> str:
        return self.message


def _raised_in(ex: BaseException, files: set[Path]) -> bool:
    """True if the innermost frame of ``ex``'s traceback is in this package or one of ``files``."""
    tb = ex.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = Path(tb.tb_frame.f_code.co_filename).resolve()
    return path.is_relative_to(PACKAGE_DIR) or path in files


def user_error_message(ex: BaseException, files: set[Path] = frozenset()) -> str | None:
    """The message to show if ``ex`` is a user mistake; None if it is a bug (keep the traceback)."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import MissingMandatoryValue

    if isinstance(ex, InstantiationException) and ex.__cause__ is not None:
        # hydra.utils.instantiate wraps what the target's constructor raised; its message names the node
        key = re.search(r"^full_key: (\S+)$", str(ex), re.MULTILINE)
        cause = ex.__cause__
        # Lightning's own word for a bad Trainer/callback argument (e.g. trainer.accelerator=gpu without one)
        lightning_says = type(cause).__name__ == "MisconfigurationException" and type(cause).__module__.startswith(
            "lightning")
        message = str(cause) if lightning_says else user_error_message(cause, files)
        return f"{key.group(1)}: {message}" if message and key else message
    if isinstance(ex, UserError):
        return str(ex)
    if isinstance(ex, MissingMandatoryValue):
        return f"{ex.full_key} is required (its config value is ???): pass {ex.full_key}=..."
    if isinstance(ex, _INPUT_ERRORS) and _raised_in(ex, set(files)):
        return str(ex)
    return None


def _job_label() -> str:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    return f" in job {HydraConfig.get().job.num}"  # the message names the offending value


def exit_on_user_error(main: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a Hydra task function (under ``@hydra.main``): a user mistake prints ``Error: <message>``
    to stderr and exits with status 1, with no traceback unless ``HYDRA_FULL_ERROR=1``.

    The exit is a ``SystemExit``, which Hydra's job runner does not catch: in a ``--multirun`` the first
    job with a user mistake ends the whole sweep at once, with status 1 and the job named in the message
    (later jobs would mostly repeat the mistake). Bugs propagate unchanged: Hydra prints their traceback.
    Only a script run (``python train.py``) exits: where the script is imported (a test calling
    ``train.main.__wrapped__(cfg)``, a notebook) every exception reaches the caller.
    """
    script = Path(inspect.getfile(main)).resolve()
    as_script = main.__module__ == "__main__"  # decided here: a pickled copy in a launcher's worker keeps it

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not as_script:
            return main(*args, **kwargs)
        try:
            return main(*args, **kwargs)
        except Interrupted as ex:  # a signal: what was kept and how to go on, exit status 128 + signal
            sys.stdout.flush()
            print(f"Interrupted{_job_label()}: {ex.message}", file=sys.stderr, flush=True)
            sys.exit(ex.code)
        except Exception as ex:
            message = user_error_message(ex, {script})
            if message is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            sys.stdout.flush()
            print(f"Error{_job_label()}: {message}", file=sys.stderr, flush=True)
            sys.exit(1)

    return wrapper


def ensure_output_dir(path: str | os.PathLike, what: str) -> Path:
    """Create the output folder ``path`` (``what`` names the option); a file in its way, or a folder that
    cannot be created or written, is a :class:`UserError` raised before any work starts."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UserError(f"{what}={path} is a file, not a folder: pass a folder (it is created if missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a parent is a file, or not writable
        raise UserError(f"{what}={path} cannot be created ({e.strerror}): pass a folder you can write to") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise UserError(f"{what}={path} is not writable: pass a folder you can write to")
    return p
