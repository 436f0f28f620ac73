from pathlib import Path

import pytest
import yaml
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


@pytest.mark.parametrize("name", sorted(KNOWN_DATASETS))
def test_config_matches_registry_and_instantiates(name, tmp_path):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
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
    assert yaml.safe_load((CONF / "imdb_offline.yaml").read_text())["max_length"] == 256
    assert yaml.safe_load((CONF / "rt_offline.yaml").read_text())["package_subset"] == "rotten_tomatoes"
