"""Compose the real Hydra configs for tests: CPU, tiny runs, outputs in tmp_path, no network."""

import os
import signal
import stat
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # cli_runner.py: CLI runs forked from a warm interpreter
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")  # tests that need W&B set it themselves
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A run started in the background by a non-interactive shell (`pytest &`, some CI runners) inherits Ctrl-C
    # ignored, and so would every run the tests start, which then rightly ignore it: the interrupt tests send Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each of the -n workers gets its share of the cores (and so do the runs its tests start as subprocesses):
    # two workers of two threads each on two cores only wait for each other.
    _share = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Small, fast settings used by every training test (real offline data, few batches).
FAST = [
    "trainer=cpu",
    "logger=none",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "model.embed_dim=16",
    "model.ffn_dim=32",
    "data.batch_size=16",
    "data.max_length=64",
]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One tokenization cache for the whole session, so each test does not redo it."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def make_cfg(tmp_path, cache_dir):
    """make_cfg(*overrides, fast=True, out="run") -> composed train config writing into tmp_path/out."""

    def make(*overrides: str, fast: bool = True, out: str = "run", config_name: str = "train") -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name, overrides=[*(FAST if fast else []), *overrides], return_hydra_config=True)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / out)
            cfg.paths.log_dir = str(tmp_path / "logs")
            cfg.paths.cache_dir = str(cache_dir)
            cfg.hydra.runtime.output_dir = str(tmp_path / out)
            cfg.hydra.job.num = 0
            cfg.hydra.job.id = 0
            if fast and cfg.get("callbacks") and cfg.callbacks.get("identifiability"):
                cfg.callbacks.identifiability.probe_size = 8
            if fast and cfg.get("callbacks") and cfg.callbacks.get("faithfulness"):
                cfg.callbacks.faithfulness.update(ig_steps=8, adversarial_examples=2, adversarial_steps=10)
        HydraConfig().set_config(cfg)
        return cfg

    yield make
    GlobalHydra.instance().clear()


@pytest.fixture
def read_only(monkeypatch):
    """read_only(folder): make ``folder`` and everything in it read-only (chmod a-w), undone after the test.

    Root writes through permission bits, so for root ``os.access`` is made to answer W_OK as the owner's bits
    say (what a non-root owner would be told); the project asks ``os.access`` before it writes a folder."""
    marked = []

    def mark(folder: Path) -> Path:
        for p in [folder, *folder.rglob("*")]:
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        marked.append(folder)
        return folder

    if os.geteuid() == 0:
        real = os.access

        def access(path, mode, *args, **kwargs):
            if mode & os.W_OK and os.path.exists(path) and not os.stat(path).st_mode & stat.S_IWUSR:
                return False
            return real(path, mode, *args, **kwargs)

        monkeypatch.setattr(os, "access", access)
    yield mark
    for folder in marked:
        for p in [folder, *folder.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


@pytest.fixture
def run_analyze():
    """analyze.py's main on its composed config with these overrides; the undecorated function, so a user
    mistake raises instead of exiting."""
    def run(overrides: list[str]):
        import sys

        sys.path.insert(0, str(ROOT))
        try:
            import analyze
        finally:
            sys.path.remove(str(ROOT))
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
                cfg = compose(config_name="analyze", overrides=overrides)
            return analyze.main.__wrapped__(cfg)
        finally:
            GlobalHydra.instance().clear()

    return run



@pytest.fixture
def rewrite_checkpoint():
    """rewrite_checkpoint(src, dst, data_cfg=None, checksum=False, **changes) -> dst: a copy of checkpoint ``src``
    whose ``data_cfg`` hyper-parameter is replaced by ``data_cfg`` and/or updated with ``changes``; ``checksum``
    also writes a matching ``.sha256`` (a crafted checkpoint can carry one: that proves nothing). The one builder
    of crafted and altered checkpoints for the tests."""
    import torch

    from identifiable_transformers.modules.checkpoint import write_checksum

    def rewrite(src: Path, dst: Path, data_cfg: dict | None = None, checksum: bool = False, **changes) -> Path:
        ckpt = torch.load(src, map_location="cpu", weights_only=True)
        hp = ckpt["hyper_parameters"]
        hp["data_cfg"] = {**(hp["data_cfg"] if data_cfg is None else data_cfg), **changes}
        torch.save(ckpt, dst)
        if checksum:
            write_checksum(dst)
        return dst

    return rewrite


@pytest.fixture(scope="session")
def one_step_checkpoint(tmp_path_factory):
    """one_step_checkpoint(module, vocab_size) -> path: ``module`` trained one AdamW step on 4 random 5-token
    examples (ids from 4 up) and saved as a full Lightning checkpoint: a genuine checkpoint, made fast."""
    import lightning.pytorch as pl
    import torch

    def make(module, vocab_size: int) -> Path:
        ids = torch.randint(4, vocab_size, (4, 5))
        data = [{"input_ids": ids[i], "attention_mask": torch.ones(5, dtype=torch.bool), "labels": torch.tensor(i % 2)}
                for i in range(4)]
        trainer = pl.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=tmp_path_factory.mktemp("fit"))
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=4))
        path = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
        trainer.save_checkpoint(path)
        return path

    return make


@pytest.fixture
def run_killed_at(monkeypatch):
    """run_killed_at(cfg, step): ``run(cfg)`` killed at the start of training step ``step`` (1-based), before that
    step changes anything (a callback raises there; the test fails unless the run dies at that point)."""
    import lightning.pytorch as pl

    from identifiable_transformers.run import training

    class Killed(Exception):
        pass

    class KillAtStep(pl.Callback):
        def __init__(self, step: int):
            self.step = step

        def on_train_batch_start(self, trainer, *args):
            if trainer.global_step + 1 == self.step:
                raise Killed(self.step)

    def run_killed(cfg, step: int) -> None:
        instantiate = training._instantiate_dict
        with monkeypatch.context() as m:
            m.setattr(training, "_instantiate_dict", lambda node: [*instantiate(node), KillAtStep(step)])
            with pytest.raises(Killed):
                training.run(cfg)

    return run_killed


@pytest.fixture
def sweep_jobs():
    """sweep_jobs(cfg, *command_line) -> the jobs (a dict of overrides each) that Hydra's basic sweeper makes of a
    composed preset's hydra.sweeper.params and command-line sweeps, in launch order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def jobs(cfg, *command_line):
        params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()] + list(command_line)  # as sweep() does
        return [dict(o.split("=") for o in job)
                for batch in BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)
                for job in batch]

    return jobs
