from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from identifiable_transformers.data import KNOWN_DATASETS, TextDataModule

CONF = Path(__file__).resolve().parents[2] / "conf" / "data"
REQUIRED = {"_target_", "name", "source", "hub_id", "hub_config", "package_subset", "data_dir", "train_file",
            "validation_file", "test_file", "text_fields", "text_separator", "label_field", "label_names",
            "num_classes", "splits", "val_fraction", "test_fraction", "split_seed", "max_length", "vocab_size",
            "min_frequency", "batch_size", "eval_batch_size", "num_workers", "length_bucketing", "cache_dir",
            "limit_train_examples"}


def test_one_config_per_known_dataset():
    assert {p.stem for p in CONF.glob("*.yaml")} == set(KNOWN_DATASETS)


def _composed(name: str):
    """The data node as Hydra builds it: the shared base plus the dataset's own keys."""
    with initialize_config_dir(config_dir=str(CONF.parent), version_base="1.3"):
        cfg = compose("train", overrides=[f"data={name}", "callbacks=none", "paths.cache_dir=/unused"])
    return cfg.data


@pytest.mark.parametrize("name", sorted(KNOWN_DATASETS))
def test_config_matches_registry_and_instantiates(name, tmp_path):
    cfg = _composed(name)
    assert REQUIRED <= set(cfg), REQUIRED - set(cfg)
    assert cfg._target_ == "identifiable_transformers.data.TextDataModule" and cfg.name == name
    spec = KNOWN_DATASETS[name]
    for k in ("source", "hub_id", "text_fields", "label_field", "label_names", "splits", "package_subset"):
        if k in spec:
            assert OmegaConf.to_container(cfg)[k] == spec[k], k
    cfg.cache_dir = str(tmp_path)
    if name == "local":
        cfg.train_file = str(tmp_path / "x.csv")
    dm = instantiate(cfg)  # construction only: no data access
    assert isinstance(dm, TextDataModule) and dm.name == name


def test_expected_hub_ids_and_fields():
    k = KNOWN_DATASETS
    assert k["agnews"]["hub_id"] == "fancyzhx/ag_news"
    assert k["yahoo"]["text_fields"] == ["question_title", "question_content", "best_answer"]
    assert k["yahoo"]["label_field"] == "topic" and len(k["yahoo"]["label_names"]) == 10
    assert k["dbpedia"]["text_fields"] == ["title", "content"] and len(k["dbpedia"]["label_names"]) == 14
    assert k["trec"]["label_field"] == "coarse_label" and len(k["trec"]["label_names"]) == 6
    assert k["sst2"]["text_fields"] == ["sentence"]
    assert _composed("imdb_offline").max_length == 256
    assert _composed("rt_offline").package_subset == "rotten_tomatoes"
