"""docs/results.md quotes each study's findings.md: ``python -m identifiable_transformers.report --update-docs``
rebuilds every study's ``findings.csv``/``findings.md`` from its committed run archives and writes them between the
markers ``<!-- findings:NAME -->`` and ``<!-- /findings:NAME -->`` (NAME: the study's folder under docs/results/).
The test suite rebuilds the blocks the same way and fails when docs/results.md differs, so a sentence of the docs
cannot quote a verdict the numbers no longer give.

Only what the findings read is unpacked (each run's metrics.json, config_resolved.yaml and
identifiability/probe.json), into a temporary folder.
"""

from __future__ import annotations

import re
import tarfile
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..common.errors import UserError
from ..common.files import atomic_write
from .findings_markdown import write_findings
from .runs import load_runs


@dataclass(frozen=True)
class Study:
    name: str  # its folder under docs/results/, and its block's name in docs/results.md
    archives: tuple[str, ...]  # relative to docs/results/
    runs: str  # the sweep folder inside the unpacked archives


STUDIES = (
    Study("faithfulness_contrast", ("faithfulness_contrast/runs.tar.xz",), "contrast"),
    Study("key_size", ("key_size/runs.tar.xz",), "key_size"),
    Study("imdb512", ("imdb512/runs.tar.xz",), "imdb512"),
    Study("factorial", ("factorial/runs_dk2_seeds_1-5.tar.xz", "factorial/runs_dk2_seeds_6-10.tar.xz",
                        "factorial/runs_dk8.tar.xz", "factorial/runs_rank.tar.xz"), "factorial"),
    Study("context_mixing/order", ("context_mixing/runs.tar.gz",), "context_mixing/order"),
    Study("minilm/rt", ("minilm/runs.tar.gz",), "minilm/rt"),
    Study("minilm/contrast", ("minilm/runs.tar.gz",), "minilm/contrast"),
    *(Study(f"faithfulness_regimes/{r}", (f"faithfulness_regimes/{r}/runs.tar.gz",), r)
      for r in ("order", "order2", "majority", "presence", "rt", "imdb")),
)
NEEDED = ("metrics.json", "config_resolved.yaml", "identifiability/probe.json")
BLOCK = re.compile(r"(<!-- findings:(?P<name>[\w/.-]+) -->\n)(?P<body>.*?)(<!-- /findings:(?P=name) -->)", re.S)


def docs_root() -> Path:
    """The repository's docs/ folder: the working directory's, else the one beside this package's source."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (base / "docs" / "results.md").is_file():
            return base / "docs"
    raise UserError("--update-docs rewrites docs/results.md from docs/results/*/runs.tar.*: run it from the "
                    "repository's root folder (a clone, not an installed package)")


def _wanted(member: tarfile.TarInfo) -> bool:
    return member.isfile() and "wandb" not in member.name and member.name.endswith(tuple("/" + n for n in NEEDED))


def unpack(archives: list[Path], into: Path) -> None:
    for archive in archives:
        with tarfile.open(archive, "r|*") as tar:  # one pass over the stream: an xz archive is slow to seek in
            for member in tar:
                if _wanted(member):
                    tar.extract(member, into, filter="data")


def study_findings(docs: Path, scratch: Path) -> dict[str, str]:
    """Every study's findings.md text, rebuilt from its archives (findings.csv and .md written into
    ``scratch/<name>``)."""
    unpacked: dict[str, Path] = {}
    texts = {}
    for study in STUDIES:
        key = "+".join(study.archives)
        if key not in unpacked:
            unpacked[key] = scratch / f"runs{len(unpacked)}"
            unpack([docs / "results" / a for a in study.archives], unpacked[key])
        out = scratch / "findings" / study.name
        out.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the full report warns about these runs; the findings need none of it
            written = write_findings(load_runs(unpacked[key] / study.runs), out)
        if written:
            texts[study.name] = (out / "findings.md").read_text()
    return texts


def blocks(text: str) -> dict[str, str]:
    """The findings blocks of docs/results.md: name -> the text between its markers."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def with_blocks(text: str, found: dict[str, str]) -> str:
    """``text`` with every findings block replaced by ``found``'s; a study without a block is an error."""
    missing = sorted(set(found) - set(blocks(text)))
    if missing:
        raise UserError(f"docs/results.md has no block for {', '.join(missing)}: add the lines "
                        f"'<!-- findings:{missing[0]} -->' and '<!-- /findings:{missing[0]} -->' where its "
                        "findings belong, then run --update-docs again")
    return BLOCK.sub(lambda m: m.group(1) + found.get(m["name"], m["body"]) + m.group(4), text)


def update_docs(docs: Path | None = None) -> list[Path]:
    """Rewrite every study's findings.csv/.md under docs/results/ and the blocks of docs/results.md."""
    docs = docs or docs_root()
    with tempfile.TemporaryDirectory(prefix="findings-") as tmp:
        found = study_findings(docs, Path(tmp))
        written = []
        for name in found:
            for f in ("findings.md", "findings.csv"):
                target = docs / "results" / name / f
                atomic_write(target, (Path(tmp) / "findings" / name / f).read_text())
                written.append(target)
    results = docs / "results.md"
    atomic_write(results, with_blocks(results.read_text(), found))
    return [*written, results]
