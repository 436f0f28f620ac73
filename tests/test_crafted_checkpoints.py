"""Checkpoints from someone else: the sweep report and analyze.py rebuild a run's data from the settings
a checkpoint holds without ever running a ``_target_`` it names (builtins.open, os.system, a module of
the attacker's own, a lookalike of TextDataModule's path); a genuine checkpoint still works."""

import json
import re
import sys
import types
from pathlib import Path

import lightning.pytorch as pl
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from identifiable_transformers.modules.checkpoint import CheckpointError, data_module_from_checkpoint
from identifiable_transformers.modules.classifier import TextClassifier
from identifiable_transformers.report import main as report

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def genuine(tmp_path_factory, cache_dir):
    """(checkpoint of a tiny model trained one step on rt_offline, its data_cfg, the data module)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["data.max_length=64", "data.batch_size=8"])
    GlobalHydra.instance().clear()
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)  # as train.py saves it
    data_cfg["cache_dir"] = "/nonexistent/training/machine/cache"  # the training machine's: never used here
    dm = data_module_from_checkpoint(data_cfg, str(cache_dir))
    dm.prepare_data()
    dm.setup("fit")
    module = TextClassifier(dm.vocab_size, dm.num_classes, embed_dim=8, num_heads=2, key_dim=2, ffn_dim=16,
                            max_len=64, label_names=list(dm.label_names), tokenizer_json=dm.tokenizer.to_str(),
                            data_cfg=data_cfg)
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path_factory.mktemp("fit"))
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    path = tmp_path_factory.mktemp("ckpt") / "genuine.ckpt"
    trainer.save_checkpoint(path)
    return path, data_cfg, dm


@pytest.fixture
def sweep_of(rewrite_checkpoint):
    """sweep_of(root, ckpt, data_cfg): a one-job sweep folder as train.py -m leaves it, whose best checkpoint
    holds ``data_cfg`` (with a matching checksum: a crafted checkpoint can carry one, and that proves nothing)."""
    return lambda root, ckpt, data_cfg: _sweep(root, ckpt, data_cfg, rewrite_checkpoint)


def _sweep(root: Path, ckpt: Path, data_cfg: dict, rewrite_checkpoint) -> Path:
    job = root / "sweep" / "0"
    (job / "checkpoints").mkdir(parents=True)
    (job / "identifiability").mkdir()
    (job / ".hydra").mkdir()
    best = rewrite_checkpoint(ckpt, job / "checkpoints" / "epoch_000.ckpt", data_cfg=data_cfg, checksum=True)
    model = {"embed_dim": 8, "num_heads": 2, "key_dim": 2, "value_dim": None, "head_combine": "concat"}
    (job / "metrics.json").write_text(json.dumps({"config": {"data": "rt_offline", "seed": 1, "model": model},
                                                  "metrics": {"test/acc": 0.5}, "best_model_path": str(best)}))
    (job / "identifiability" / "probe.json").write_text(json.dumps({"indices": [3, 5], "lengths": [12, 20]}))
    return root / "sweep"


LOOKALIKE = "identifiable_transformers.data_evil.TextDataModule"  # the right prefix and class name


@pytest.fixture(params=["builtins.open", "os.system", "foreign", "lookalike"])
def crafted(request, tmp_path, monkeypatch, genuine):
    """(data_cfg that would create ``marker`` if anything instantiated it, the _target_ it names, marker)."""
    marker = tmp_path / "pwned"
    if request.param == "builtins.open":
        return {"_target_": "builtins.open", "file": str(marker), "mode": "w"}, "builtins.open", marker
    if request.param == "os.system":
        return {"_target_": "os.system", "_args_": [f"touch '{marker}'"]}, "os.system", marker
    if request.param == "foreign":  # the attacker's module, importable here: importing it is enough
        (tmp_path / "mods").mkdir()
        (tmp_path / "mods" / "attacker_mod.py").write_text(
            f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
            f"def make(**kwargs):\n    Path({str(marker)!r}).write_text('called')\n")
        monkeypatch.syspath_prepend(str(tmp_path / "mods"))
        request.addfinalizer(lambda: sys.modules.pop("attacker_mod", None))  # the next test imports its own
        return {"_target_": "attacker_mod.make", "name": "rt_offline"}, "attacker_mod.make", marker
    fake = types.ModuleType("identifiable_transformers.data_evil")  # importable by that name while the test runs
    fake.TextDataModule = lambda **kwargs: marker.write_text("called")
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    return {**genuine[1], "_target_": LOOKALIKE}, LOOKALIKE, marker


def test_the_crafted_targets_would_run_if_called(crafted):
    """The test's premise: calling each crafted data_cfg's target with its arguments (as hydra's
    ``instantiate`` would, where its blocklist lets it) creates the marker."""
    import importlib

    data_cfg, target, marker = crafted
    kwargs = {k: v for k, v in data_cfg.items() if k not in ("_target_", "_args_")}
    module, name = target.rsplit(".", 1)
    result = getattr(importlib.import_module(module), name)(*data_cfg.get("_args_", []), **kwargs)
    if hasattr(result, "close"):
        result.close()  # builtins.open's file
    assert marker.exists()


def test_report_never_runs_a_target_a_checkpoint_names(crafted, genuine, tmp_path, cache_dir, capsys, sweep_of):
    data_cfg, target, marker = crafted
    sweep = sweep_of(tmp_path, genuine[0], data_cfg)
    assert report([str(sweep), "--out", str(tmp_path / "out"), "--cache-dir", str(cache_dir)]) == 0
    assert not marker.exists()
    err = capsys.readouterr().err
    assert re.search(rf"warning: 0: no key-aware count, skipped: checkpoint .*epoch_000.ckpt: its data_cfg names "
                     rf"_target_='{re.escape(target)}', not identifiable_transformers.data.TextDataModule: refused "
                     r"\(a checkpoint's _target_ is never run\)", err), err
    assert not (sweep / "0" / "identifiability" / "key_aware.json").exists()
    assert (tmp_path / "out" / "results.md").is_file()  # the rest of the report is still written


def test_analyze_never_runs_a_target_a_checkpoint_names(crafted, genuine, tmp_path, cache_dir, run_analyze, sweep_of):
    data_cfg, target, marker = crafted
    ckpt = sweep_of(tmp_path, genuine[0], data_cfg) / "0" / "checkpoints" / "epoch_000.ckpt"
    with pytest.raises(CheckpointError, match=rf"_target_='{re.escape(target)}', not .*never run.*text=\.\.\."):
        run_analyze([f"ckpt_path={ckpt}", "split=validation", f"output_dir={tmp_path / 'out'}",
                     f"paths.cache_dir={cache_dir}"])
    assert not marker.exists()


@pytest.mark.parametrize("change, refused", [
    ({"_target_": "identifiable_transformers.data.TextDataModuleX"}, "_target_="),
    ({"_target_": "identifiable_transformers.TextDataModule"}, "_target_="),
    ({"evil_key": 1}, r"keys \['evil_key'\]"),
    ({"splits": {"_target_": "os.system", "_args_": ["true"]}}, r"values for \['splits'\]"),
    ({"max_length": [[{"_target_": "os.system"}]]}, r"values for \['max_length'\]"),
])
def test_only_plain_text_data_module_arguments_pass(genuine, change, refused):
    with pytest.raises(CheckpointError, match=refused):
        data_module_from_checkpoint({**genuine[1], **change}, "/unused")


def test_report_computes_the_key_aware_count_of_a_genuine_checkpoint(genuine, tmp_path, cache_dir, capsys, sweep_of):
    ckpt, data_cfg, dm = genuine
    sweep = sweep_of(tmp_path, ckpt, data_cfg)
    assert report([str(sweep), "--out", str(tmp_path / "out"), "--cache-dir", str(cache_dir)]) == 0
    ka = json.loads((sweep / "0" / "identifiability" / "key_aware.json").read_text())
    # default lengths 16, 64, 256: 256 exceeds the model's max_len 64, and no review reaches 64 tokens
    assert ka["targets"] == [16, 64, 256] and ka["lengths"] == [16]
    assert len(dm.val_dataset[ka["indices"][0]]["input_ids"]) >= 16  # a rebuilt validation example, cut to 16
    captured = capsys.readouterr()
    assert "no validation example reaches [64, 256] tokens" in captured.out
    assert not Path(data_cfg["cache_dir"]).exists()  # this machine's cache, not the training machine's
    assert "warning" not in captured.err
    assert ka["random_alternative_dim"] and ka["margin"]
