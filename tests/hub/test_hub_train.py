"""``python train.py data=NAME`` for every hub dataset of the registry, through the real
``datasets.load_dataset`` against the local hub endpoint (tests/hub/serve.py), then again with
the endpoint stopped and a fresh ``paths.cache_dir``: the second run must come from the HF cache.

The expected rows, classes and label counts are computed from the fixture repos (the cards),
not from the project's code. agnews runs in the default suite; every entry runs with ``-m slow``.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from hub_helpers import hub_env, train
from serve import CARDS, PARQUET_REF, ROWS, LocalHub, build_repos, split_rows

from identifiable_transformers.data import KNOWN_DATASETS
from identifiable_transformers.data import sources as S

HUB_NAMES = sorted(n for n, s in KNOWN_DATASETS.items() if s["source"] == "hub")
FAST = {"agnews"}
OFFLINE_NOTE = "from the local cache only"


def expected_counts(name: str, theirs: str) -> list[int]:
    card = CARDS[KNOWN_DATASETS[name]["hub_id"]]
    counts = Counter(split_rows(card, theirs)[card.label])
    return [counts[k] for k in range(len(dict(card.features)[card.label]))]


def check_meta(name: str, meta: dict) -> None:
    spec = KNOWN_DATASETS[name]
    card = CARDS[spec["hub_id"]]
    assert meta is not None, "no tokenized cache was written"
    assert meta["label_names"] == spec["label_names"]
    assert meta["num_classes"] == len(dict(card.features)[card.label])
    carved = 0
    for ours in ("train", "validation", "test"):
        theirs = spec["splits"][ours]
        if theirs is None:
            carved += meta["rows"][ours]
        elif ours != "train":  # a split taken as it is: its rows and classes are the fixture's
            assert meta["rows"][ours] == ROWS[theirs], ours
            assert meta["class_counts"][ours] == expected_counts(name, theirs), ours
    assert meta["rows"]["train"] + carved == ROWS[spec["splits"]["train"]]
    assert sum(meta["dropped_empty_text"].values()) == 0


def _run_both(name, hub, tmp_path):
    spec = KNOWN_DATASETS[name]
    env = hub_env(tmp_path, hub.url)
    proc, meta = train(name, tmp_path, env, "online")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert OFFLINE_NOTE not in log
    check_meta(name, meta)
    rev = spec.get("hub_revision") or "main"
    assert any(f"/datasets/{spec['hub_id']}/resolve/" in r and r.endswith(".parquet") for r in hub.requests)
    assert any(f"/api/datasets/{spec['hub_id']}/" in r for r in hub.requests) or rev == "main"
    assert (tmp_path / "hf" / "hub" / f"datasets--{spec['hub_id'].replace('/', '--')}").is_dir()

    hub.stop()  # second run: no endpoint, a fresh tokenized cache, only the HF cache left
    proc2, meta2 = train(name, tmp_path, env, "offline")
    log2 = proc2.stdout + proc2.stderr
    assert proc2.returncode == 0, log2[-4000:]
    assert OFFLINE_NOTE in log2
    for k in ("label_names", "rows", "class_counts", "vocab_size"):
        assert meta2[k] == meta[k], k


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in HUB_NAMES])
def test_train_from_local_hub_then_from_cache(name, local_hub, tmp_path):
    _run_both(name, local_hub, tmp_path)


def _child(tmp_path, endpoint: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=hub_env(tmp_path, endpoint),
                          capture_output=True, text=True, timeout=180)


def test_trec_main_branch_is_a_script_repo_and_the_hint_says_what_to_do(local_hub, tmp_path):
    # the real load_dataset on the fixture's main branch (only datasets imported: a fast child) ...
    proc = _child(tmp_path, local_hub.url, (
        "import datasets\ntry:\n    datasets.load_dataset('CogComp/trec')\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("RuntimeError Dataset scripts are no longer supported"), proc.stdout
    # ... and the advice load_hub adds to that error
    hint = S._hint("CogComp/trec", None, RuntimeError(proc.stdout))
    assert "loading script" in hint and f"data.hub_revision={PARQUET_REF}" in hint


_LOAD_HUB = ("import sys\nfrom identifiable_transformers.data import sources as S\n"
             "try:\n    S.load_hub('CogComp/trec', revision={rev!r}, name='trec')\n"
             "except S.DataUnavailableError as e:\n    print('ERR', e)\n    sys.exit(3)\n")


@pytest.mark.slow
def test_load_hub_trec_main_says_what_to_do(local_hub, tmp_path):
    proc = _child(tmp_path, local_hub.url, _LOAD_HUB.format(rev=None))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "loading script" in proc.stdout and f"data.hub_revision={PARQUET_REF}" in proc.stdout


@pytest.mark.slow
def test_load_hub_trec_without_parquet_branch_says_what_to_do(tmp_path):
    repos = build_repos()
    del repos["CogComp/trec"][PARQUET_REF]
    with LocalHub(repos=repos) as hub:
        proc = _child(tmp_path, hub.url, _LOAD_HUB.format(rev=PARQUET_REF))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "parquet conversion" in proc.stdout and "data=local" in proc.stdout
