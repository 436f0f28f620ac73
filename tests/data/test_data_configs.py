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
            "limit_train_examples", "rationale_field", "synthetic", "tokenizer_file"}


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


# name -> (source, hub_id, text_fields, label_field, number of label names, validation/test splits, max_length),
# written from the dataset cards (docs/data.md), independently of the configs and of the registry.
EXPECTED = {
    "agnews": ("hub", "fancyzhx/ag_news", ["text"], "label", 4, (None, "test"), 128),
    "amazon_polarity": ("hub", "fancyzhx/amazon_polarity", ["title", "content"], "label", 2, (None, "test"), 256),
    "dbpedia": ("hub", "fancyzhx/dbpedia_14", ["title", "content"], "label", 14, (None, "test"), 128),
    "imdb": ("hub", "stanfordnlp/imdb", ["text"], "label", 2, (None, "test"), 256),
    "imdb_offline": ("package", None, ["text"], "label", 2, (None, None), 256),
    "local": ("local", None, ["text"], "label", None, (None, None), 256),
    "rotten_tomatoes": ("hub", "cornell-movie-review-data/rotten_tomatoes", ["text"], "label", 2,
                        ("validation", "test"), 128),
    "rt_offline": ("package", None, ["text"], "label", 2, (None, None), 128),
    "sst2": ("hub", "stanfordnlp/sst2", ["sentence"], "label", 2, (None, "validation"), 64),  # hub test: no labels
    "trec": ("hub", "CogComp/trec", ["text"], "coarse_label", 6, (None, "test"), 64),
    "yahoo": ("hub", "community-datasets/yahoo_answers_topics", ["question_title", "question_content", "best_answer"],
              "topic", 10, (None, "test"), 256),
    "yelp_full": ("hub", "Yelp/yelp_review_full", ["text"], "label", 5, (None, "test"), 256),
    "yelp_polarity": ("hub", "fancyzhx/yelp_polarity", ["text"], "label", 2, (None, "test"), 256),
    "synthetic_majority": ("synthetic", None, ["text"], "label", None, (None, None), 32),
    "synthetic_contrast": ("synthetic", None, ["text"], "label", None, (None, None), 64),
    "synthetic_contrast_pair": ("synthetic", None, ["text"], "label", None, (None, None), 64),
    "synthetic_order": ("synthetic", None, ["text"], "label", None, (None, None), 32),
    "synthetic_presence": ("synthetic", None, ["text"], "label", None, (None, None), 32),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_composed_config_has_the_documented_values(name):
    assert set(EXPECTED) == set(KNOWN_DATASETS)
    cfg = OmegaConf.to_container(_composed(name))
    labels = cfg["label_names"]
    got = (cfg["source"], cfg["hub_id"], cfg["text_fields"], cfg["label_field"], labels and len(labels),
           (cfg["splits"]["validation"], cfg["splits"]["test"]), cfg["max_length"])
    assert got == EXPECTED[name]
    assert cfg["splits"]["train"] == "train" and cfg["val_fraction"] == 0.1 and cfg["batch_size"] == 64
    assert cfg["package_subset"] == {"rt_offline": "rotten_tomatoes", "imdb_offline": "imdb"}.get(name)
    # the synthetic tasks carry their rationales; no other dataset has one unless the user names its column
    assert cfg["rationale_field"] == ("rationale" if name.startswith("synthetic_") else None)
    if name.startswith("synthetic_"):
        task = {"synthetic_contrast": "order", "synthetic_contrast_pair": "pair"}.get(  # on longer inputs
            name, name.removeprefix("synthetic_"))
        assert cfg["synthetic"]["task"] == task


@pytest.mark.parametrize("name", sorted(KNOWN_DATASETS))
def test_the_documented_tokenizer_file_override_composes(name):
    # docs/data.md and the "another tokenizer" error say data.tokenizer_file=PATH (no '+'): every data config has it
    assert _composed(name).tokenizer_file is None
    with initialize_config_dir(config_dir=str(CONF.parent), version_base="1.3"):
        cfg = compose("train", overrides=[f"data={name}", "callbacks=none", "data.tokenizer_file=/runs/a/tokenizer.json"])
    assert cfg.data.tokenizer_file == "/runs/a/tokenizer.json"
