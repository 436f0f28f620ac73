"""docs/results.md quotes each study's findings as the committed runs give them: every block between
``<!-- findings:NAME -->`` and ``<!-- /findings:NAME -->`` is rebuilt here from docs/results/*/runs.tar.* (the
command ``python -m identifiable_transformers.report --update-docs`` writes the same) and must be equal, as must the
committed findings.md beside each study's tables."""

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
