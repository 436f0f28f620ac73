"""What the composed presets actually set: models at build time, experiment/debug/search/launcher presets,
trainer configs, and the job lists the sweep presets expand to. Expected values are written out here
from the documentation (docs/identifiability.md section 3, the presets' own comments)."""

import itertools

import hydra
import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

from identifiable_transformers.modules.classifier import TextClassifier


def _build(cfg) -> TextClassifier:
    return hydra.utils.instantiate(cfg.model, vocab_size=50, num_classes=2, _convert_="all")


# (overrides) -> (head_combine, embed d, heads h, key_dim, value_dim, positional) of the built encoder
BUILT = {
    ("model=baseline",): ("concat", 64, 4, 16, 16, "learned"),  # key/value null -> d/h
    ("model=identifiable",): ("add", 64, 4, 2, 64, "learned"),  # value null -> d
    ("experiment=reference",): ("add", 32, 4, 16, 32, "none"),
    ("experiment=reference", "model=baseline"): ("concat", 32, 4, 16, 8, "none"),
}


@pytest.mark.parametrize("overrides", list(BUILT), ids=",".join)
def test_model_presets_build_the_documented_encoder(make_cfg, overrides):
    cfg = make_cfg(*overrides, fast=False)
    combine, d, h, dk, dv, positional = BUILT[overrides]
    model = _build(cfg).model
    got = (model.head_combine, model.embed_dim, model.num_heads, model.key_dim, model.value_dim)
    assert got == (combine, d, h, dk, dv)
    attn = model.layers[0].attn
    assert (attn.q_proj.out_features, attn.v_proj.out_features) == (h * dk, h * dv)
    assert attn.out_proj.in_features == (h * dv if combine == "concat" else dv)
    assert model.positional == positional and model.pooling == "cls" and model.num_layers == 1
    assert model.max_len == cfg.data.max_length == 128  # rt_offline, interpolated into the model
    assert model.layers[0].linear1.out_features == 256 and not model.layers[0].norm_first
    hp = _build(cfg).hparams
    assert (hp.lr, hp.weight_decay, hp.dropout, hp.scheduler, hp.warmup_steps) == (1e-3, 0.01, 0.1, "constant", 0)


# preset -> {dotted key: expected composed value}
PRESETS = {
    "experiment=reference": {"data.batch_size": 64, "data.val_fraction": 0.3, "trainer.max_epochs": 10,
                             "tags": ["reference"], "model.lr": 1e-3, "model.ffn_dim": 256},
    "debug=fdr": {"trainer.fast_dev_run": True, "trainer.accelerator": "cpu", "trainer.detect_anomaly": True,
                  "trainer.max_epochs": 1, "logger": {}, "task_name": "debug", "data.num_workers": 0},
    "debug=limit": {"trainer.max_epochs": 2, "trainer.limit_train_batches": 5, "trainer.limit_val_batches": 2,
                    "trainer.limit_test_batches": 2, "trainer.fast_dev_run": False, "logger": {}},
    "debug=overfit": {"trainer.max_epochs": 30, "trainer.overfit_batches": 3, "logger": {},
                      "callbacks.model_checkpoint.monitor": "train/loss_epoch",
                      "callbacks.model_checkpoint.mode": "min"},
    "hparams_search=optuna": {"hydra.mode": RunMode.MULTIRUN, "hydra.sweeper.direction": "maximize",
                              "hydra.sweeper.n_trials": 20, "hydra.sweeper.sampler.seed": 1234,
                              "optimized_metric": "val/acc_best",
                              "hydra.sweeper.params": {"model.lr": "interval(0.0001, 0.005)",
                                                       "model.key_dim": "choice(1, 2, 4, 8, 16)",
                                                       "model.dropout": "choice(0.0, 0.1, 0.2, 0.3)",
                                                       "data.batch_size": "choice(32, 64, 128)"}},
    "callbacks=[default,early_stopping]": {"callbacks.early_stopping.monitor": "val/acc",
                                           "callbacks.early_stopping.mode": "max",
                                           "callbacks.model_checkpoint.monitor": "val/acc",
                                           "callbacks.model_checkpoint.mode": "max"},
    "hydra/launcher=joblib_local": {"hydra.launcher.n_jobs": 2},
    "logger=wandb": {"logger.wandb.project": "identifiable-transformers", "logger.wandb.offline": False,
                     "logger.wandb.tags": []},
}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_set_the_documented_values(make_cfg, preset):
    cfg = make_cfg(preset, fast=False)
    for key, expected in PRESETS[preset].items():
        value = OmegaConf.select(cfg, key)
        value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        assert value == expected, (key, value)


def test_callback_and_launcher_presets_name_the_right_classes(make_cfg):
    cfg = make_cfg("callbacks=[default,early_stopping]", fast=False)
    assert set(cfg.callbacks) == {"model_checkpoint", "last_checkpoint", "lr_monitor", "progress_bar",
                                  "identifiability", "faithfulness", "equivalence", "early_stopping"}
    assert cfg.hydra.runtime.choices["hydra/launcher"] == "basic"
    cfg = make_cfg("hydra/launcher=joblib_local", fast=False)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert make_cfg("hparams_search=optuna", fast=False).hydra.sweeper._target_.endswith("OptunaSweeper")


# trainer -> (accelerator, devices, strategy, num_nodes, precision); slurm inherits ddp's strategy/precision
TRAINERS = {
    "default": ("auto", 1, "auto", 1, "32-true"),
    "cpu": ("cpu", 1, "auto", 1, "32-true"),
    "gpu": ("gpu", 1, "auto", 1, "bf16-mixed"),
    "ddp": ("gpu", 2, "ddp", 1, "bf16-mixed"),
    "ddp_sim": ("cpu", 2, "ddp", 1, "32-true"),
    "slurm": ("gpu", 4, "ddp", 2, "bf16-mixed"),
}


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_trainer_configs_compose_to_the_documented_devices(make_cfg, trainer):
    t = make_cfg(f"trainer={trainer}", fast=False).trainer
    assert t._target_ == "lightning.pytorch.Trainer"
    assert (t.accelerator, t.devices, t.strategy, t.num_nodes, t.precision) == TRAINERS[trainer]
    assert (t.max_epochs, t.gradient_clip_val, t.use_distributed_sampler) == (10, 1.0, False)
    if t.accelerator in ("cpu", "auto"):
        assert hydra.utils.instantiate(t, logger=False).num_devices == t.devices


KEY_DIMS = ["1", "2", "4", "8", "16", "32", "64"]
SWEEPS = {  # preset -> (the grid it spans, composed values every job shares)
    "smoke": ({"model": ["baseline", "identifiable"], "model.key_dim": ["2", "16"]},
              {"trainer.accelerator": "cpu", "trainer.max_epochs": 1, "trainer.limit_train_batches": 10,
               "logger": ["csv"]}),
    "key_size_offline": ({"model": ["baseline", "identifiable"], "model.key_dim": KEY_DIMS, "seed": ["1", "2", "3"]},
                         {"trainer.accelerator": "auto", "logger": ["csv"], "tags": ["key_size"]}),
    "key_size_hub": ({"data": ["agnews", "imdb", "yelp_polarity", "dbpedia", "sst2", "trec"],
                      "model": ["baseline", "identifiable"], "model.key_dim": KEY_DIMS, "seed": ["1", "2", "3"]},
                     {"trainer.accelerator": "gpu", "trainer.precision": "bf16-mixed", "logger": ["wandb"]}),
}


@pytest.mark.parametrize("name", list(SWEEPS))
def test_sweep_presets_expand_to_the_expected_jobs(make_cfg, name):
    grid, shared = SWEEPS[name]
    cfg = make_cfg(f"+sweep={name}", fast=False)
    for key, expected in shared.items():
        value = OmegaConf.select(cfg, key)
        if key == "logger":  # the logger names
            value = list(value)
        elif OmegaConf.is_config(value):
            value = OmegaConf.to_container(value)
        assert value == expected, (key, value)
    # expand the preset's sweeper params the way Hydra's basic sweeper does
    params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()]
    jobs = [job for batch in BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)
            for job in batch]
    expected = [[f"{k}={v}" for k, v in zip(grid, values)] for values in itertools.product(*grid.values())]
    assert sorted(map(sorted, jobs)) == sorted(map(sorted, expected))
    assert len(jobs) == {"smoke": 4, "key_size_offline": 42, "key_size_hub": 252}[name]  # the presets' own counts
    # one job composed in full: its model is the one the overrides name
    cfg = make_cfg(f"+sweep={name}", *jobs[-1], fast=False)
    model = _build(cfg).model
    job = dict(o.split("=") for o in jobs[-1])
    assert model.key_dim == int(job["model.key_dim"])
    assert model.head_combine == {"baseline": "concat", "identifiable": "add"}[job["model"]]
