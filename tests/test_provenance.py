"""A run's metrics.json names the code, libraries, data and device that produced it (run/provenance.py).

The commit and the dirty flag are checked against git itself (``git rev-parse``, ``git status``) on throw-away
repositories: clean, dirty, a worktree, packed refs, a detached HEAD, and a folder outside any checkout."""

import json
import subprocess
import time
from pathlib import Path

import lightning
import pytest
import torch

from identifiable_transformers.run import provenance
from identifiable_transformers.run.training import run

GIT = ["git", "-c", "user.email=t@example.org", "-c", "user.name=t", "-c", "init.defaultBranch=main"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git checkout with one commit, holding a package folder (where the source would be)."""
    root = tmp_path / "checkout"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "a.py").write_text("x = 1\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "one")
    return root


def test_clean_checkout_names_its_head(repo):
    commit, root = provenance.read_head(repo / "src" / "pkg")
    assert commit == _git(repo, "rev-parse", "HEAD") and len(commit) == 40
    assert root == repo.resolve()
    assert provenance.is_dirty(root) is False


def test_a_changed_tracked_file_is_dirty_an_untracked_one_is_not(repo):
    (repo / "src" / "pkg" / "new.py").write_text("y = 2\n")
    assert provenance.is_dirty(repo) is False  # as git describe --dirty: untracked files do not count
    (repo / "src" / "pkg" / "a.py").write_text("x = 2\n")
    assert provenance.is_dirty(repo) is True


def test_packed_refs_detached_head_and_second_commit(repo):
    (repo / "src" / "pkg" / "a.py").write_text("x = 3\n")
    _git(repo, "commit", "-qam", "two")
    _git(repo, "pack-refs", "--all")  # the branch now lives only in packed-refs
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert provenance.read_head(repo)[0] == _git(repo, "rev-parse", "HEAD")
    first = _git(repo, "rev-parse", "HEAD~1")
    _git(repo, "checkout", "-q", first)  # detached: HEAD holds the sha itself
    assert provenance.read_head(repo)[0] == first


def test_a_worktree_names_its_own_branch(repo, tmp_path):
    (repo / "src" / "pkg" / "a.py").write_text("x = 4\n")
    _git(repo, "commit", "-qam", "two")
    other = tmp_path / "wt"
    _git(repo, "worktree", "add", "-q", "-b", "side", str(other), "HEAD~1")
    commit, root = provenance.read_head(other / "src" / "pkg")
    assert commit == _git(other, "rev-parse", "HEAD") != _git(repo, "rev-parse", "HEAD")
    assert root == other.resolve() and provenance.is_dirty(root) is False


def test_outside_a_checkout_everything_git_is_null(tmp_path):
    folder = tmp_path / "plain" / "pkg"
    folder.mkdir(parents=True)
    assert provenance.read_head(folder) == (None, None)
    code = provenance.code_provenance(0.0, folder)
    assert code["commit"] is None and code["dirty"] is None
    assert code["start_time"] == "1970-01-01T00:00:00+00:00"


def test_an_unborn_branch_or_no_git_is_unknown_not_a_guess(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")  # HEAD names a branch with no commit yet
    assert provenance.read_head(empty) == (None, None)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # git is not installed
    assert provenance.is_dirty(empty) is None


@pytest.mark.parametrize("where", ["clean", "dirty", "outside"])
def test_a_run_records_its_provenance(make_cfg, tmp_path, repo, monkeypatch, where):
    """A real (tiny) run, its source taken to live in a clean or dirty checkout, or in none."""
    if where == "dirty":
        (repo / "src" / "pkg" / "a.py").write_text("x = 5\n")
    source = repo / "src" / "pkg" if where != "outside" else tmp_path / "installed" / "pkg"
    source.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(provenance, "PACKAGE_DIR", source)
    before = time.time()
    run(make_cfg("debug=fdr"))
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())["provenance"]
    if where == "outside":
        assert record["commit"] is None and record["dirty"] is None
    else:
        assert record["commit"] == _git(repo, "rev-parse", "HEAD")
        assert record["dirty"] is (where == "dirty")
    assert (record["torch"], record["lightning"]) == (torch.__version__, lightning.__version__)
    assert record["package_version"] == "0.1.0" and record["transformers"]
    assert record["device"] == "cpu"
    cache = [p.name for p in Path(make_cfg().paths.cache_dir).glob("*/*") if p.is_dir()]
    assert record["data_fingerprint"] in cache  # the cache entry the run read
    started = provenance._dt.datetime.fromisoformat(record["start_time"]).timestamp()
    assert before - 1 <= started <= time.time()
