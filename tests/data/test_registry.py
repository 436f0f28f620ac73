"""One source of truth for the dataset specs: the registry is read from conf/data/*.yaml. These
tests fail if the registry's composition and Hydra's drift apart, or if either entry point
(``data=NAME`` / ``TextDataModule.from_name(NAME)``) builds something the other does not."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import OmegaConf

from identifiable_transformers.data import CLASSIC_DATASETS, KNOWN_DATASETS, TextDataModule
from identifiable_transformers.data.registry import CONF_DIR, NOT_SPEC, load_specs

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(p.stem for p in (ROOT / "conf" / "data").glob("*.yaml"))


def _hydra_data(name: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"data={name}", "callbacks=none"])
    GlobalHydra.instance().clear()
    return cfg.data


def test_registry_reads_this_checkouts_configs():
    assert CONF_DIR.resolve() == (ROOT / "conf" / "data").resolve()  # through the package's link to conf/
    assert sorted(KNOWN_DATASETS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_is_hydras_composition(name):
    composed = OmegaConf.to_container(_hydra_data(name), resolve=False)
    assert composed["name"] == name
    assert {k: v for k, v in composed.items() if k not in NOT_SPEC} == KNOWN_DATASETS[name]


def test_every_spec_key_is_a_datamodule_argument():
    params = set(inspect.signature(TextDataModule.__init__).parameters)
    for name, spec in KNOWN_DATASETS.items():
        assert set(spec) <= params, (name, set(spec) - params)


@pytest.mark.parametrize("name", NAMES)
def test_from_name_builds_what_data_name_builds(name, tmp_path):
    cfg = _hydra_data(name)
    cfg.cache_dir = str(tmp_path)
    extra = {"train_file": str(tmp_path / "x.csv")} if name == "local" else {}
    if extra:
        cfg.train_file = extra["train_file"]
    via_hydra = instantiate(cfg)
    via_name = TextDataModule.from_name(name, cache_dir=str(tmp_path), **extra)
    assert via_name.cache_settings() == via_hydra.cache_settings()
    for attr in ("source", "hub_id", "hub_revision", "classic_columns", "batch_size", "max_length", "splits"):
        assert getattr(via_name, attr) == getattr(via_hydra, attr), attr


def test_an_edited_yaml_is_what_the_registry_returns(tmp_path):
    conf = tmp_path / "data"
    shutil.copytree(CONF_DIR, conf)
    p = conf / "agnews.yaml"
    p.write_text(p.read_text().replace("max_length: 128", "max_length: 99"))
    (conf / "base" / "text_classification.yaml").write_text(
        (conf / "base" / "text_classification.yaml").read_text().replace("batch_size: 64", "batch_size: 7"))
    specs = load_specs(conf)
    assert specs["agnews"]["max_length"] == 99 and specs["agnews"]["batch_size"] == 7
    assert specs["imdb"]["batch_size"] == 7 and KNOWN_DATASETS["agnews"]["max_length"] == 128


def test_a_misnamed_config_is_refused(tmp_path):
    conf = tmp_path / "data"
    shutil.copytree(CONF_DIR, conf)
    (conf / "agnews_copy.yaml").write_text((conf / "agnews.yaml").read_text())
    with pytest.raises(ValueError, match="agnews_copy"):
        load_specs(conf)


def test_missing_conf_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="conf/data"):
        load_specs(tmp_path / "nope")


def test_classic_sets_are_the_zhang_et_al_six():
    assert set(CLASSIC_DATASETS) == {"agnews", "yelp_polarity", "yelp_full", "amazon_polarity", "dbpedia", "yahoo"}
    assert KNOWN_DATASETS["agnews"]["classic_columns"] == ["title", "description"]
