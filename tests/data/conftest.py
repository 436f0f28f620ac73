"""Fixtures for the data-layer tests: small, self-written corpora in tmp_path."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

WORDS = {
    "sports": "goal match team score league coach player season win cup".split(),
    "tech": "chip software cloud data model robot code server phone app".split(),
    "world": "election minister treaty border summit war peace vote nation leader".split(),
}
COMMON = "the a of and to in on with for is".split()


def make_rows(n_per_class: int = 30, seed: int = 0, classes=("sports", "tech", "world")) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for c in classes:
        for _ in range(n_per_class):
            n = rng.randint(3, 15)
            words = [rng.choice(WORDS[c] if rng.random() < 0.6 else COMMON) for _ in range(n)]
            rows.append({"text": " ".join(words) + rng.choice([".", "!", "?"]), "label": c})
    rng.shuffle(rows)
    return rows


def write_rows(path: Path, rows: list[dict], fmt: str | None = None) -> Path:
    fmt = fmt or path.suffix.lstrip(".")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt in ("csv", "tsv"):
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="," if fmt == "csv" else "\t")
            w.writeheader()
            w.writerows(rows)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif fmt == "parquet":
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path)
    else:
        raise ValueError(fmt)
    return path


@pytest.fixture(name="make_rows")
def _make_rows_fixture():
    return make_rows


@pytest.fixture(name="write_rows")
def _write_rows_fixture():
    return write_rows


@pytest.fixture
def local_dm(tmp_path):
    """Factory: write rows to a local file and build a TextDataModule on it (cache in tmp_path)."""
    from identifiable_transformers.data import TextDataModule

    def build(rows=None, fmt="csv", **kw):
        rows = rows if rows is not None else make_rows()
        f = write_rows(tmp_path / f"train.{fmt}", rows, fmt)
        args = dict(name="local_test", source="local", train_file=str(f), cache_dir=str(tmp_path / "cache"),
                    max_length=32, vocab_size=200, min_frequency=1, batch_size=8)
        args.update(kw)
        return TextDataModule(**args)

    return build
