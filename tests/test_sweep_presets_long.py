"""The issue-30 sweep presets (multirun_sweeps/sweep/{imdb512, long_range, long_range_two_layers}.yaml) compose to
the values multirun_sweeps/README.md documents, and expand to the documented jobs. Expected values are written
out here from the issue and the README, not read from the presets."""

import itertools

import hydra
import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

SEEDS = ["1", "2", "3"]
DESIGNS = ["baseline", "identifiable"]
# preset -> (grid, composed values every job shares, number of jobs)
PRESETS = {
    "imdb512": (
        {"model": DESIGNS, "model.key_dim": ["1", "2", "8", "16", "64"], "seed": SEEDS},
        {"data.name": "imdb_offline", "data.max_length": 512, "model.max_len": 512, "data.limit_train_examples": None,
         "trainer.accelerator": "gpu", "trainer.max_epochs": 10, "callbacks.early_stopping.monitor": "val/acc",
         "callbacks.early_stopping.mode": "max", "callbacks.faithfulness.max_length": None,
         "callbacks.identifiability.max_probe_length": None, "callbacks.identifiability.key_aware_examples": 0,
         "callbacks.identifiability.length_bins": ["dv+1", "2d+2", "max/2", "max"], "model.num_layers": 1},
        30),
    "long_range": (
        {"model": DESIGNS, "model.key_dim": ["1", "2", "8", "64"], "seed": SEEDS},
        {"data.name": "synthetic_order", "data.max_length": 512, "model.max_len": 512, "data.synthetic.task": "order",
         "data.synthetic.min_length": 131, "data.synthetic.max_length": 511, "data.synthetic.min_gap": 65,
         "data.synthetic.size": 20000,
         "data.rationale_field": "rationale", "trainer.accelerator": "gpu", "trainer.max_epochs": 20,
         "callbacks.early_stopping.monitor": "val/acc", "callbacks.faithfulness.max_length": None,
         "model.num_layers": 1},
        24),
    "long_range_two_layers": (
        {"model": DESIGNS, "model.key_dim": ["1", "2", "8", "64"], "seed": SEEDS},
        {"data.name": "synthetic_order", "data.max_length": 512, "data.synthetic.min_length": 131,
         "data.synthetic.min_gap": 65,
         "trainer.max_epochs": 20, "callbacks.faithfulness.max_length": None, "model.num_layers": 2,
         "tags": ["long_range", "faithfulness", "two_layers"]},
        24),
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_long_input_presets_compose_and_expand_to_the_documented_jobs(make_cfg, name):
    grid, shared, count = PRESETS[name]
    cfg = make_cfg(f"+sweep={name}", fast=False)
    for key, expected in shared.items():
        value = OmegaConf.select(cfg, key, default="<missing>")
        value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        assert value == expected, (key, value)
    assert list(cfg.logger) == ["csv"]
    assert "rollout" in cfg.callbacks.faithfulness.explainers and "effective" in cfg.callbacks.faithfulness.explainers
    params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()]
    jobs = [job for batch in BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)
            for job in batch]
    expected = [[f"{k}={v}" for k, v in zip(grid, values)] for values in itertools.product(*grid.values())]
    assert sorted(map(sorted, jobs)) == sorted(map(sorted, expected)) and len(jobs) == count
    # one job composed in full, on the CPU (the README's small-scale variant): the model the overrides name
    cfg = make_cfg(f"+sweep={name}", *jobs[-1], "trainer=cpu", fast=False)
    assert cfg.trainer.accelerator == "cpu"
    model = hydra.utils.instantiate(cfg.model, vocab_size=50, num_classes=4, _convert_="all").model
    job = dict(o.split("=") for o in jobs[-1])
    assert model.key_dim == int(job["model.key_dim"]) and model.max_len == 512
    assert model.head_combine == {"baseline": "concat", "identifiable": "add"}[job["model"]]
    assert model.num_layers == shared["model.num_layers"]
    # the callbacks build with the preset's settings
    for key in ("identifiability", "faithfulness", "early_stopping"):
        hydra.utils.instantiate(cfg.callbacks[key])
