"""Which code, libraries, data and device produced a run: the ``provenance`` block of its ``metrics.json``.

A study's tables are only as good as the claim that one code produced them: the vocabulary fix (7aff372) moved
test accuracy by about a point, and a run that records no commit cannot say which side of it it ran on. The
commit is that of the checkout holding this package's source (not of the working directory: Hydra may change
it), read from ``.git`` without spawning git (worktrees and packed refs included); whether the tree is dirty
(tracked files changed, as ``git describe --dirty`` says) needs git itself, run once with a short timeout. Every
field is null where it cannot be known (an installed package outside a checkout, no git on the machine): a
missing fact is recorded as missing, never guessed.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import re
import subprocess
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parents[1]
DISTRIBUTION = "identifiable-transformers"
_SHA = re.compile(r"^[0-9a-f]{40}$")
GIT_TIMEOUT_S = 5.0


def _git_dir(start: Path) -> Path | None:
    """The git directory of the checkout holding ``start``: ``.git`` itself, or where a worktree's ``.git``
    file points."""
    for folder in (start, *start.parents):
        dot_git = folder / ".git"
        if dot_git.is_dir():
            return dot_git
        if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = dot_git.read_text().strip()
            if text.startswith("gitdir:"):
                target = Path(text[len("gitdir:"):].strip())
                return target if target.is_absolute() else (folder / target).resolve()
            return None
    return None


def _common_dir(git_dir: Path) -> Path:
    """Where branches and packed refs live: a worktree's ``commondir``, else the git directory itself."""
    common = git_dir / "commondir"
    if common.is_file():
        target = Path(common.read_text().strip())
        return target if target.is_absolute() else (git_dir / target).resolve()
    return git_dir


def _resolve_ref(git_dir: Path, ref: str, depth: int = 0) -> str | None:
    if depth > 5:  # a loop of symbolic refs
        return None
    for base in (git_dir, _common_dir(git_dir)):
        loose = base / ref
        if loose.is_file():
            value = loose.read_text().strip()
            if value.startswith("ref:"):
                return _resolve_ref(git_dir, value[4:].strip(), depth + 1)
            return value if _SHA.match(value) else None
    packed = _common_dir(git_dir) / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name.strip() == ref and _SHA.match(sha):
                return sha
    return None


def read_head(start: Path | None = None) -> tuple[str | None, Path | None]:
    """The 40-hex commit checked out in the checkout holding ``start`` (default: this package's source) and the
    checkout's root; (None, None) outside one (or a HEAD this cannot read: an unborn branch, a damaged file)."""
    start = Path(start or PACKAGE_DIR)
    try:
        git_dir = _git_dir(start.resolve())
        if git_dir is None or not (git_dir / "HEAD").is_file():
            return None, None
        head = (git_dir / "HEAD").read_text().strip()
        sha = _resolve_ref(git_dir, head[4:].strip()) if head.startswith("ref:") else head
    except (OSError, UnicodeDecodeError):
        return None, None
    if sha is None or not _SHA.match(sha):
        return None, None
    root = next(f for f in (start.resolve(), *start.resolve().parents) if (f / ".git").exists())
    return sha, root


def is_dirty(root: Path | None, timeout: float = GIT_TIMEOUT_S) -> bool | None:
    """Whether tracked files of the checkout at ``root`` differ from its HEAD (untracked files do not count);
    None when unknown (no checkout, no git, git refusing the folder, or slower than ``timeout``)."""
    if root is None:
        return None
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(done.stdout.strip()) if done.returncode == 0 else None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_version() -> str | None:
    """This package's version: the installed distribution's, else pyproject.toml's beside the source."""
    pyproject = PACKAGE_DIR.parents[1] / "pyproject.toml"
    if pyproject.is_file():  # the source that runs may be another checkout than the installed one
        match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
        if match:
            return match.group(1)
    return _version(DISTRIBUTION)


def code_provenance(start_time: float, start: Path | None = None) -> dict[str, Any]:
    """What is known when a run starts: the code (commit, dirty tree), the versions and the start time
    (``start_time``, seconds since the epoch, written as UTC ISO 8601)."""
    import lightning
    import torch

    commit, root = read_head(start)
    return {
        "commit": commit,
        "dirty": is_dirty(root) if commit else None,
        "package_version": _package_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "transformers": _version("transformers"),  # not imported: a run of the project's own encoders needs none
        "start_time": _dt.datetime.fromtimestamp(start_time, _dt.UTC).isoformat(timespec="seconds"),
    }


def data_fingerprint(datamodule: Any) -> str | None:
    """The tokenized-data cache key (a hash of the data files' contents, the preparation code and the data
    settings: data/cache.py); None for a data module without one."""
    try:
        return datamodule.cache_path().name
    except Exception:  # noqa: BLE001 - another data module: the fingerprint is unknown, not an error
        return None


def device_of(trainer: Any) -> str | None:
    """The device the run computed on, with the accelerator's name ("cuda:0 (NVIDIA H100 80GB HBM3)", "cpu"),
    and the number of processes when there were several."""
    import torch

    try:
        device = trainer.strategy.root_device
    except Exception:  # noqa: BLE001
        return None
    name = str(device)
    if device.type == "cuda" and torch.cuda.is_available():
        name += f" ({torch.cuda.get_device_name(device)})"
    world = getattr(trainer, "world_size", 1) or 1
    return f"{name} x {world} processes" if world > 1 else name


def run_provenance(code: dict[str, Any], datamodule: Any, trainer: Any) -> dict[str, Any]:
    """The ``provenance`` block: :func:`code_provenance` (taken at the start) with the data and the device."""
    return {**code, "data_fingerprint": data_fingerprint(datamodule), "device": device_of(trainer)}
