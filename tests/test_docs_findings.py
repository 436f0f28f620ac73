"""docs/results.md quotes each study's findings as the committed runs give them: every block between
``<!-- findings:NAME -->`` and ``<!-- /findings:NAME -->`` is rebuilt here from docs/results/*/runs.tar.* (the
command ``python -m identifiable_transformers.report --update-docs`` writes the same) and must be equal, as must the
committed findings.md beside each study's tables."""

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from identifiable_transformers.common.errors import UserError
from identifiable_transformers.report.docs import STUDIES, blocks, study_findings, with_blocks

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> dict[str, str]:
    return study_findings(DOCS, tmp_path_factory.mktemp("findings"))


def test_every_study_has_its_findings(rebuilt):
    assert sorted(rebuilt) == sorted(s.name for s in STUDIES)


def test_the_docs_blocks_equal_the_rebuilt_findings(rebuilt):
    text = (DOCS / "results.md").read_text()
    quoted = blocks(text)
    stale = [name for name in rebuilt if quoted.get(name) != rebuilt[name]]
    assert not stale, (f"docs/results.md's findings blocks {stale} differ from what the committed runs give: run "
                       "python -m identifiable_transformers.report --update-docs")
    assert with_blocks(text, rebuilt) == text


def test_the_committed_findings_files_equal_the_rebuilt_ones(rebuilt):
    for name, text in rebuilt.items():
        assert (DOCS / "results" / name / "findings.md").read_text() == text, name


def test_a_block_is_replaced_and_a_missing_one_is_named():
    text = "a\n<!-- findings:x/y -->\nold\n<!-- /findings:x/y -->\nb\n"
    assert with_blocks(text, {"x/y": "new\n"}) == "a\n<!-- findings:x/y -->\nnew\n<!-- /findings:x/y -->\nb\n"
    with pytest.raises(UserError, match="no block for z: add the lines '<!-- findings:z -->'"):
        with_blocks(text, {"z": "new\n"})


VOCABULARY_FIX = "7aff372"  # the word-level tokenizer reads the training rows only (issue 52)


def _own_rt_runs() -> list[tuple[str, str, dict]]:
    """(archive, member, provenance) of every committed rt_offline run of the project's own encoder."""
    found = []
    for archive in sorted((DOCS / "results").rglob("runs*.tar.*")):
        with tarfile.open(archive, "r|*") as tar:
            for member in tar:
                if not (member.isfile() and member.name.endswith("/metrics.json") and "wandb" not in member.name):
                    continue
                result = json.loads(tar.extractfile(member).read())
                config = result["config"]
                if config["data"] == "rt_offline" and not config["model"].get("name_or_path"):
                    found.append((archive.name, member.name, result.get("provenance") or {}))
    return found


def test_every_committed_rt_offline_run_records_a_commit_with_the_vocabulary_fix():
    runs = _own_rt_runs()
    assert len(runs) >= 60
    unrecorded = [f"{a}:{m}" for a, m, p in runs if not p.get("commit") or p.get("dirty")]
    assert not unrecorded, f"runs without a clean recorded commit: {unrecorded[:5]}"
    root = DOCS.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("no git checkout: the commits' ancestry cannot be checked")
    for commit in sorted({p["commit"] for _, _, p in runs}):
        known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root, capture_output=True)
        if known.returncode != 0:
            pytest.skip(f"{commit} is not in this clone's history (a shallow clone)")
        after = subprocess.run(["git", "merge-base", "--is-ancestor", VOCABULARY_FIX, commit], cwd=root)
        assert after.returncode == 0, f"{commit} does not contain the vocabulary fix {VOCABULARY_FIX}"
