"""Every hub entry of the registry (conf/data/*.yaml) against its dataset card, as the fixture
repos of tests/hub/serve.py record the cards; and the fixture server's hub API."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from serve import CARDS, PARQUET_REF, ROWS, class_words, split_rows

from identifiable_transformers.data import KNOWN_DATASETS

HUB = {n: s for n, s in KNOWN_DATASETS.items() if s["source"] == "hub"}
# Registry label names that deliberately differ from the card's ClassLabel names (docs/data.md says why).
RENAMED = {"yelp_polarity": ["1", "2"]}


def test_every_card_is_a_registry_entry_and_back():
    assert sorted(s["hub_id"] for s in HUB.values()) == sorted(CARDS)


@pytest.mark.parametrize("name", sorted(HUB))
def test_registry_entry_matches_its_card(name):
    spec, card = HUB[name], CARDS[HUB[name]["hub_id"]]
    feats = dict(card.features)
    assert spec["label_field"] == card.label
    names = feats[card.label]
    assert len(spec["label_names"]) == len(names)
    assert (RENAMED.get(name) or spec["label_names"]) == names
    for f in spec["text_fields"]:
        assert feats.get(f) == "string", f
    for ours, theirs in spec["splits"].items():
        if theirs is not None:
            assert theirs in card.files and theirs not in card.unlabelled, (ours, theirs)
    assert spec["splits"]["train"] == "train"
    assert spec["hub_config"] is None  # every card has one config, which load_dataset picks
    assert (spec["hub_revision"] == PARQUET_REF) == card.parquet_branch
    if spec.get("classic_columns"):  # the classic CSV has the same text columns (agnews: the hub joined them)
        assert len(spec["classic_columns"]) >= len(spec["text_fields"])


def test_fixture_rows_are_learnable_and_deterministic():
    card = CARDS["fancyzhx/ag_news"]
    rows = split_rows(card, "train")
    assert rows == split_rows(card, "train")
    for text, k in zip(rows["text"], rows["label"]):
        words = text.split()
        assert sum(w in class_words(k) for w in words) == 3
        assert not any(w in class_words(j) for j in range(4) if j != k for w in words)
    assert split_rows(CARDS["stanfordnlp/sst2"], "test")["label"] == [-1] * ROWS["test"]


def test_server_speaks_the_hub_api(local_hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # tests/conftest.py sets HF_HUB_OFFLINE=1
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)  # no side request to huggingface.co
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "agent_harnesses.json"))  # not ~/.cache
    api = HfApi(endpoint=local_hub.url, token=False)
    info = api.dataset_info("fancyzhx/ag_news")
    assert len(info.sha) == 40 and "README.md" in [s.rfilename for s in info.siblings]
    tree = [e.path for e in api.list_repo_tree("fancyzhx/ag_news", repo_type="dataset", recursive=True)]
    assert tree == [".gitattributes", "README.md", "data", "data/test-00000-of-00001.parquet",
                    "data/train-00000-of-00001.parquet"]
    info_paths = api.get_paths_info("fancyzhx/ag_news", ["README.md", "data", "nope"], repo_type="dataset")
    assert [type(e).__name__ for e in info_paths] == ["RepoFile", "RepoFolder"]
    conv = api.dataset_info("CogComp/trec", revision=PARQUET_REF)
    assert sorted(s.rfilename for s in conv.siblings) == [".gitattributes", "default/test/0000.parquet",
                                                          "default/train/0000.parquet"]
    path = hf_hub_download("fancyzhx/ag_news", "README.md", repo_type="dataset", endpoint=local_hub.url,
                           cache_dir=tmp_path, token=False)
    assert "class_label" in open(path).read()
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info("nobody/nothing")
    with pytest.raises(RevisionNotFoundError):
        api.dataset_info("fancyzhx/ag_news", revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("fancyzhx/ag_news", "nope.txt", repo_type="dataset", endpoint=local_hub.url,
                        cache_dir=tmp_path, token=False)


def test_serve_py_runs_as_a_command():
    serve = Path(__file__).with_name("serve.py")
    proc = subprocess.Popen([sys.executable, str(serve), "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        url = re.search(r"HF_ENDPOINT=(http://127\.0\.0\.1:\d+)", banner).group(1)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to 127.0.0.1
        with opener.open(f"{url}/api/datasets/stanfordnlp/sst2", timeout=10) as r:
            assert json.load(r)["id"] == "stanfordnlp/sst2"
    finally:
        proc.terminate()
        proc.wait(10)
