"""The training app end to end on the real offline default data (CPU, few batches)."""

import json
import os
import sys
from pathlib import Path

import hydra
import pytest
import torch
from cli_runner import run_cli
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from identifiable_transformers.modules.classifier import TextClassifier
from identifiable_transformers.run.training import check_strategy, run
from identifiable_transformers.tracking.loggers import build_loggers

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
options = lambda group: sorted(p.stem for p in (CONF / group).glob("*.yaml"))  # noqa: E731


@pytest.mark.parametrize("model", [m for m in options("model") if m != "pretrained"])  # tests/pretrained/
@pytest.mark.parametrize("data", options("data"))
def test_every_model_and_data_config_instantiates_offline(make_cfg, tmp_path, model, data):
    extra = []
    if data == "local":  # needs a file to point at
        (tmp_path / "train.csv").write_text("text,label\ngood film,1\nbad film,0\n")
        extra = [f"data.train_file={tmp_path / 'train.csv'}"]
    cfg = make_cfg(f"model={model}", f"data={data}", *extra)
    dm = hydra.utils.instantiate(cfg.data, _convert_="all")  # building it must not download anything
    assert dm.__class__.__name__ == "TextDataModule"
    lit = hydra.utils.instantiate(cfg.model, vocab_size=50, num_classes=3, _convert_="all")
    assert isinstance(lit, TextClassifier)
    # value_dim null resolves at build: d for added heads, d/h for concatenated ones (d = 16 in FAST)
    expected = ("add", 2, 16) if model == "identifiable" else ("concat", 4, 4)
    assert (lit.model.head_combine, lit.model.key_dim, lit.model.value_dim) == expected


def test_slurm_launcher_starts_one_task_per_device(make_cfg):
    cfg = make_cfg("hydra/launcher=slurm", "trainer=slurm", "trainer.devices=8", fast=False)
    launcher = cfg.hydra.launcher
    assert "SlurmLauncher" in launcher._target_
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)


def test_fast_dev_run_end_to_end(make_cfg, tmp_path):
    result = run(make_cfg("debug=fdr"))
    assert {"train/loss_epoch", "val/acc", "test/acc", "test/f1"} <= set(result["metrics"])
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["metrics"] == result["metrics"]
    assert (tmp_path / "run" / "tokenizer.json").is_file()


def test_short_training_learns_and_checkpoint_reloads_without_hydra(make_cfg, tmp_path):
    cfg = make_cfg("trainer.max_epochs=3", "trainer.limit_train_batches=null", "trainer.limit_val_batches=null",
                   "trainer.limit_test_batches=null", "model.embed_dim=32", "data.batch_size=64")
    result = run(cfg)
    m = result["metrics"]
    assert m["test/acc"] > 0.6, m  # balanced binary task: chance is 0.5
    assert result["best_epoch"] in (0, 1, 2) and result["best_val_acc"] == pytest.approx(m["val/acc_best"])
    # the checkpoint alone (no Hydra) rebuilds model, tokenizer and labels and predicts the same
    ckpt = result["best_model_path"]
    loaded = TextClassifier.load_from_checkpoint(ckpt, map_location="cpu").eval()
    assert loaded.label_names == ["negative", "positive"]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    fresh = TextClassifier(**{k: v for k, v in loaded.hparams.items()})
    fresh.load_state_dict(state)
    from identifiable_transformers.data import encode_texts

    batch = encode_texts(loaded.tokenizer, ["a gripping , beautiful film", "dull and far too long"], 64)
    with torch.no_grad():
        a = loaded(batch["input_ids"], batch["attention_mask"]).logits
        b = fresh.eval()(batch["input_ids"], batch["attention_mask"]).logits
    torch.testing.assert_close(a, b)
    assert batch["input_ids"][0, 0].item() == loaded.tokenizer.token_to_id("<cls>")


def _final_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


# 3 epochs of 4 steps with a warm-up + linear schedule; last.ckpt is refreshed every 3 steps.
RESUME = ["trainer.max_epochs=3", "trainer.deterministic=true", "callbacks=[model_checkpoint,last_checkpoint]",
          "callbacks.last_checkpoint.every_n_train_steps=3", "model.scheduler=linear", "model.warmup_steps=2",
          "model.dropout=0.3", "test=false"]


# (step it dies at, step of the last.ckpt it leaves): epochs are steps 1-4, 5-8, 9-12.
@pytest.mark.parametrize("kills", [[(5, 4)], [(7, 6)], [(7, 6), (11, 9)]], ids=["epoch_end", "mid_epoch", "twice"])
def test_resume_after_a_kill_matches_the_uninterrupted_run(make_cfg, tmp_path, run_killed_at, kills):
    straight = run(make_cfg(*RESUME, out="straight"))
    ckpt = None
    for i, (step, saved) in enumerate(kills):
        run_killed_at(make_cfg(*RESUME, *([f"ckpt_path={ckpt}"] if ckpt else []), out=f"killed{i}"), step)
        ckpt = tmp_path / f"killed{i}" / "checkpoints" / "last.ckpt"
        assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == saved
    resumed = run(make_cfg(*RESUME, f"ckpt_path={ckpt}", out="resumed"))

    assert resumed["metrics"] == straight["metrics"]
    assert resumed["best_epoch"] == straight["best_epoch"]
    a, b = _final_weights(tmp_path / "straight"), _final_weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []


def test_last_ckpt_is_the_newest_state_even_without_improvement(make_cfg, tmp_path):
    # lr=0: val/acc never improves after epoch 0, so Lightning's save_last would leave last.ckpt at step 4
    result = run(make_cfg("trainer.max_epochs=3", "model.lr=0", "callbacks=[model_checkpoint,last_checkpoint]",
                          "test=false"))
    assert result["best_epoch"] == 0
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert (last["global_step"], last["epoch"]) == (12, 2)
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))


def test_evaluate_only_from_checkpoint(make_cfg, tmp_path):
    first = run(make_cfg("callbacks=[model_checkpoint]"))
    again = run(make_cfg("train=false", f"ckpt_path={first['best_model_path']}", out="eval"))["metrics"]
    assert again["test/acc"] == pytest.approx(first["metrics"]["test/acc"])
    with pytest.raises(FileNotFoundError, match="ckpt_path"):
        run(make_cfg("train=false", "ckpt_path=/nonexistent/x.ckpt"))


def test_plain_ddp_inside_local_multirun_is_refused(make_cfg):
    cfg = make_cfg("trainer=ddp_sim", "trainer.strategy=ddp")
    OmegaConf.set_readonly(cfg.hydra, False)
    with open_dict(cfg):
        cfg.hydra.mode = "MULTIRUN"
    HydraConfig().set_config(cfg)
    with pytest.raises(ValueError, match="ddp_spawn"):
        check_strategy(cfg)


def _train_py(*args, tmp_path, env=None, timeout=600):
    cmd = [sys.executable, str(ROOT / "train.py"), *args]
    return run_cli(cmd, cwd=tmp_path, timeout=timeout, env={**os.environ, **(env or {})})


FAST_CLI = ["trainer=cpu", "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
            "trainer.limit_test_batches=2", "trainer.enable_progress_bar=false", "model.embed_dim=16",
            "model.ffn_dim=32", "data.max_length=64", "callbacks.identifiability.probe_size=8"]


def test_two_job_multirun_writes_two_run_dirs(tmp_path, cache_dir):
    proc = _train_py("-m", "model=baseline,identifiable", "logger=none", *FAST_CLI,
                     f"paths.log_dir={tmp_path}/logs", f"paths.cache_dir={cache_dir}", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = sorted((tmp_path / "logs").rglob("metrics.json"))
    assert len(found) == 2, found
    combines = {json.loads(p.read_text())["config"]["model"]["head_combine"] for p in found}
    assert combines == {"concat", "add"}


def test_wandb_without_api_key_logs_offline(tmp_path, cache_dir):
    env = {"WANDB_MODE": "", "WANDB_API_KEY": "", "HOME": str(tmp_path)}  # no key, no ~/.netrc
    proc = _train_py("logger=wandb", *FAST_CLI, f"paths.log_dir={tmp_path}/logs", f"paths.cache_dir={cache_dir}",
                     tmp_path=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "offline" in proc.stderr + proc.stdout
    runs = list((tmp_path / "logs").rglob("offline-run-*/*.wandb"))
    assert len(runs) == 1, "no offline W&B run was written"
    # wandb 0.31 keeps no readable summary offline: the keys are plain strings in its protobuf records
    blob = runs[0].read_bytes()
    for key in ("train/loss_epoch", "val/acc", "val/f1", "test/acc", "val/ident/null_dim", "model/params_total"):
        assert key.encode() in blob, key


KILLER = """
import os, signal
import lightning.pytorch as pl

class KillAtStep(pl.Callback):  # SIGKILL, at the start of training step `step`, on every rank
    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
"""


def _ddp_sim_args(tmp_path, cache_dir, epochs: int) -> list[str]:
    return ["trainer=ddp_sim", "logger=csv", *[a for a in FAST_CLI if not a.startswith("trainer=")],
            f"trainer.max_epochs={epochs}", "trainer.limit_train_batches=4", "trainer.deterministic=true",
            "callbacks.last_checkpoint.every_n_train_steps=3", "model.scheduler=linear", "model.warmup_steps=2",
            "model.dropout=0.3", f"paths.log_dir={tmp_path}/logs", f"paths.cache_dir={cache_dir}"]


def test_ddp_sim_two_cpu_processes_train_test_and_write_metrics(tmp_path, cache_dir):
    """2 CPU ranks train, test and write metrics.json (the kill and resume: the slow test below)."""
    common = _ddp_sim_args(tmp_path, cache_dir, epochs=1)
    proc = _train_py(*common, f"hydra.run.dir={tmp_path / 'straight'}", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    assert "test/acc" in metrics["metrics"]


@pytest.mark.slow
def test_ddp_sim_two_cpu_processes_and_exact_resume_after_sigkill(tmp_path, cache_dir):
    """2 CPU ranks: train; then SIGKILL both ranks mid-epoch and resume from last.ckpt: same run."""
    (tmp_path / "killer.py").write_text(KILLER)
    common = _ddp_sim_args(tmp_path, cache_dir, epochs=3)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    runs = {name: tmp_path / name for name in ("straight", "killed", "resumed")}
    proc = _train_py(*common, f"hydra.run.dir={runs['straight']}", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    straight = json.loads((runs["straight"] / "metrics.json").read_text())
    assert "test/acc" in straight["metrics"]

    # steps 5-8 are epoch 1: dies at the start of step 7, leaving the last.ckpt of step 6
    proc = _train_py(*common, f"hydra.run.dir={runs['killed']}", "+callbacks.kill._target_=killer.KillAtStep",
                     "+callbacks.kill.step=7", tmp_path=tmp_path, env=env)
    assert proc.returncode == -9, proc.stderr[-3000:]
    last = runs["killed"] / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 6
    proc = _train_py(*common, f"hydra.run.dir={runs['resumed']}", f"ckpt_path={last}", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = json.loads((runs["resumed"] / "metrics.json").read_text())
    untimed = lambda m: {k: v for k, v in m["metrics"].items() if not k.endswith("_s")}  # noqa: E731 (timings)
    assert untimed(resumed) == untimed(straight) and len(untimed(straight)) > 20
    a, b = _final_weights(runs["straight"]), _final_weights(runs["resumed"])
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.mark.parametrize("logger,cls", [("csv", "CSVLogger"), ("tensorboard", "TensorBoardLogger"), ("none", None)])
def test_logger_configs_instantiate(make_cfg, logger, cls):
    loggers = build_loggers(make_cfg(f"logger={logger}"))
    assert [type(lg).__name__ for lg in loggers] == ([cls] if cls else [])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["identifiable", "baseline"])
def test_default_run_reaches_the_accuracy_target(make_cfg, model):
    """The full offline default (10 epochs, about a minute on 2 cores) clears 70% test accuracy."""
    result = run(make_cfg(f"model={model}", "trainer=cpu", "logger=none", "trainer.enable_progress_bar=false", fast=False))
    assert result["metrics"]["test/acc"] >= 0.70, result["metrics"]
