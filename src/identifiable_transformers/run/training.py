"""What ``train.py`` runs: build data, model, callbacks, loggers and trainer from a Hydra config,
fit, test the best checkpoint, and write ``metrics.json`` in the run directory."""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import time
import warnings
from pathlib import Path

import hydra
import lightning.pytorch as pl
import torch
from filelock import FileLock
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.seed import isolate_rng
from omegaconf import DictConfig, OmegaConf

from ..common.errors import Interrupted
from ..common.files import DiskFullError, atomic_write, free_space, is_disk_full, writable
from ..common.interrupts import Terminated, how_to_resume, received_sigterm, sigterm_stops_the_run, where_it_stopped
from ..common.quiet import ModelSummary, silence_known_noise
from ..modules.checkpoint import read_checkpoint
from ..tracking.loggers import build_loggers, hydra_runtime, log_once, quiet_logging_errors
from ..tracking.wandb_logging import log_run_end
from .checks import check_run_folder
from .config_checks import check_config
from .history import MetricsHistory
from .lock import unlock_run_folder
from .provenance import code_provenance, run_provenance
from .resume import (
    RunSettingsRecord,
    adopt_evaluation_settings,
    check_resume,
    check_resume_model,
    check_resume_processes,
    record_changes,
    recorded_changes,
    recorded_processes,
    training_settings,
)

log = logging.getLogger(__name__)


def check_strategy(cfg: DictConfig) -> None:
    """Plain ddp re-runs the script per rank: inside a local --multirun that re-runs the sweep."""
    multirun, _, _ = hydra_runtime()
    strategy = str(cfg.trainer.get("strategy", "auto"))
    devices = cfg.trainer.get("devices", 1)
    many = devices == -1 or (isinstance(devices, int) and devices > 1) or not isinstance(devices, int)
    if not (multirun and many and strategy.startswith("ddp") and "spawn" not in strategy):
        return
    launcher = str(HydraConfig.get().launcher.get("_target_", ""))
    if "submitit" in launcher.lower():
        return  # SLURM starts one task per device itself; Lightning does not relaunch
    raise ValueError(
        f"trainer.strategy={strategy} with trainer.devices={devices} inside a local --multirun would make every "
        "extra rank re-run the whole sweep. Use trainer.strategy=ddp_spawn, single-device jobs "
        "(hydra/launcher=joblib_local), or hydra/launcher=slurm."
    )


def _instantiate_dict(node: DictConfig | None) -> list:
    """Instantiate every entry with a ``_target_`` (config groups hold named entries)."""
    if not node:
        return []
    return [hydra.utils.instantiate(v) for v in node.values() if isinstance(v, DictConfig) and "_target_" in v]


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    return {
        "model/params_total": sum(p.numel() for p in model.parameters()),
        "model/params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def _scalars(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) or getattr(v, "numel", lambda: 0)() == 1}


def run(cfg: DictConfig) -> dict:
    """Train and/or test as configured; returns the metrics written to ``metrics.json``.

    SIGTERM or Ctrl-C end it with :class:`~.cli.Interrupted` (exit status 128 + signal) saying how to resume; a
    full disk with a :class:`~.files.DiskFullError` saying the same. The run folder is locked while it runs."""
    check_config(cfg)  # types, unknown keys, impossible model shapes: before any data is prepared
    start = time.time()
    log_once()
    silence_known_noise()
    check_strategy(cfg)
    output_dir, locked = check_run_folder(cfg)  # writable, locked, and not a finished run's unless resuming it
    state: dict = {"code": code_provenance(start)}  # the trainer, once built: where an interruption stopped
    try:
        with sigterm_stops_the_run():
            return _run(cfg, output_dir, start, state)
    except (Terminated, SIGTERMException):
        raise Interrupted(signal.SIGTERM, f"SIGTERM received{where_it_stopped(state.get('trainer'))}. "
                          f"{how_to_resume(cfg, output_dir)}") from None
    except KeyboardInterrupt:
        raise _ctrl_c(cfg, output_dir, state) from None
    except SystemExit as e:  # Lightning ends a Ctrl-C inside fit/test with sys.exit(1), after its own cleanup
        trainer = state.get("trainer")
        if isinstance(e, Interrupted) or trainer is None or trainer.state.status != TrainerStatus.INTERRUPTED:
            raise
        raise _ctrl_c(cfg, output_dir, state) from None
    except DiskFullError as e:
        quiet_logging_errors()
        raise DiskFullError(f"{e} {how_to_resume(cfg, output_dir)}") from None
    except OSError as e:  # a full disk under a writer of another library (Lightning's CSV logger, Hydra, W&B)
        if not is_disk_full(e):
            raise
        quiet_logging_errors()
        raise DiskFullError(f"the disk is full ({free_space(output_dir)} free on the disk of {output_dir}): {e}. "
                            f"Free space there, or write the run to another disk. {how_to_resume(cfg, output_dir)}"
                            ) from None
    finally:
        if locked:
            unlock_run_folder(output_dir)


def _ctrl_c(cfg: DictConfig, output_dir: Path, state: dict) -> Interrupted:
    where = where_it_stopped(state.get("trainer"))
    return Interrupted(signal.SIGINT, f"Ctrl-C{where}. {how_to_resume(cfg, output_dir)}")


def _run(cfg: DictConfig, output_dir: Path, start: float, state: dict) -> dict:
    ckpt_path = cfg.get("ckpt_path")
    # resume_changes: the record metrics.json and every checkpoint carry; allowed: this resume's changes to it
    ckpt, resume_changes, allowed, trained_on, step = None, [], {}, {}, 0
    if ckpt_path:  # refused here with a clear message, before Lightning meets a damaged or foreign file
        ckpt, _ = read_checkpoint(ckpt_path, what="ckpt_path")
        allowed = check_resume(cfg, ckpt, ckpt_path)  # training: any setting but the length of training is refused
        resume_changes = recorded_changes(ckpt) if cfg.get("train") else []
        step = int(ckpt.get("global_step", 0))
        adopted = adopt_evaluation_settings(cfg, ckpt)  # evaluation: record the settings the weights were trained with
        if adopted:
            log.warning("train=false: recording the checkpoint's own %s (this run's values apply to training only)",
                        ", ".join(f"{k}={old!r} (not {new!r})" for k, (old, new) in adopted.items()))
    if cfg.get("seed") is not None:
        pl.seed_everything(cfg.seed, workers=True)
    output_dir.mkdir(parents=True, exist_ok=True)

    log.info("Data <%s>", cfg.data.get("name", cfg.data._target_))
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    # Every rank builds the vocabulary before the model exists; the lock makes one of them do the work.
    lock_dir = Path(os.path.expanduser(str(cfg.paths.cache_dir)))
    if writable(lock_dir):
        lock_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock_dir / "prepare_data.lock")):
            datamodule.prepare_data()
    else:  # a read-only cache is only read (nobody can build into it); prepare_data says so if it must build
        datamodule.prepare_data()
    datamodule.setup("fit")

    log.info("Model <%s>", cfg.model._target_)
    # Built by hand, not hydra.utils.instantiate: data_cfg holds a _target_ that must stay a plain dict.
    model_kwargs = OmegaConf.to_container(cfg.model, resolve=True)
    model = hydra.utils.get_class(model_kwargs.pop("_target_"))(
        **model_kwargs,
        vocab_size=datamodule.vocab_size,
        num_classes=datamodule.num_classes,
        pad_id=datamodule.pad_id,
        label_names=list(datamodule.label_names),
        tokenizer_json=datamodule.tokenizer.to_str(),
        data_cfg=OmegaConf.to_container(cfg.data, resolve=True),
    )
    if ckpt is not None:
        check_resume_model(cfg, ckpt, model, datamodule, ckpt_path)  # shapes, architecture, tokenizer
        trained_on = recorded_processes(ckpt)  # checked once the trainer knows its own
        del ckpt  # the weights and optimiser state: Lightning reads the file again when it resumes
    # after the checks: a refused resume into its own folder keeps the tokenizer.json its message may name
    atomic_write(output_dir / "tokenizer.json", datamodule.tokenizer.to_str(pretty=True), "tokenizer")
    loggers = build_loggers(cfg)
    history = MetricsHistory(output_dir)  # metrics_history.csv: always, whatever the callbacks config
    callbacks = [*_instantiate_dict(cfg.get("callbacks")), history,
                 RunSettingsRecord(training_settings(cfg), resume_changes)]
    # Lightning refuses these without a logger / with the bar disabled: drop them instead of failing.
    if cfg.trainer.get("enable_progress_bar") is False:
        callbacks = [c for c in callbacks if not isinstance(c, pl.callbacks.ProgressBar)]
    if not loggers:
        callbacks = [c for c in callbacks if not isinstance(c, pl.callbacks.LearningRateMonitor)]
    if cfg.trainer.get("enable_model_summary") is not False and not any(
            isinstance(c, pl.callbacks.ModelSummary) for c in callbacks):
        callbacks.append(ModelSummary())  # Lightning's own, less its column of zero FLOPs
    trainer: pl.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    state["trainer"] = trainer
    if cfg.get("train"):
        allowed = {**allowed, **check_resume_processes(trained_on, trainer, ckpt_path)}
        record_changes(resume_changes, step, allowed)  # the list RunSettingsRecord writes into every checkpoint

    try:
        params = count_parameters(model)
        with isolate_rng():  # starting a W&B run draws random numbers; results must not depend on the logger
            for lg in loggers:
                lg.log_hyperparams({"cfg": OmegaConf.to_container(cfg, resolve=True), **params})
        log.info("Parameters: %s", params)
        timings: dict[str, float] = {}  # wall-clock seconds of fit (training, validation, diagnostics) and test

        if cfg.get("train"):
            with warnings.catch_warnings():
                # TextDataModule's checkpointed data position makes a mid-epoch resume exact; Lightning cannot tell.
                warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before")
                fit_start = time.time()
                trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
                timings["fit_s"] = round(time.time() - fit_start, 2)
            if received_sigterm():  # arrived where Lightning noted it and finished its loop anyway
                raise Terminated(signal.SIGTERM)
            if trainer.global_step == 0:
                raise ValueError(
                    f"training ran no step (trainer.max_epochs={cfg.trainer.get('max_epochs')}, "
                    f"trainer.max_steps={cfg.trainer.get('max_steps')}, trainer.limit_train_batches="
                    f"{cfg.trainer.get('limit_train_batches')}): there is no trained model to test. Train at least "
                    "one step (e.g. trainer.max_epochs=1), or evaluate a checkpoint with train=false ckpt_path=PATH.")
        # After a resume that had nothing left to train (a finished run), callback_metrics is empty: the last
        # epoch's metrics come from the history the checkpoint carried.
        fit_metrics = {**history.final_metrics(), **_scalars(trainer.callback_metrics)}
        if cfg.get("train") and "val/acc_best" not in fit_metrics:  # a checkpoint older than the history
            best = float(model.val_acc_best.max_value)  # restored with the checkpoint (a persistent metric state)
            if best > float("-inf"):
                fit_metrics["val/acc_best"] = best

        test_metrics: dict[str, float] = {}
        # the one keeping the best val/acc (LastCheckpoint has no monitor)
        ckpt_cb = next((c for c in trainer.checkpoint_callbacks if getattr(c, "monitor", None)), None)
        if cfg.get("test"):
            if cfg.get("train"):
                best = ckpt_cb.best_model_path if ckpt_cb is not None else ""
                if not best:
                    log.warning("No best checkpoint was saved: testing the final weights")
                test_ckpt = best or None
                if test_ckpt:
                    read_checkpoint(test_ckpt, what="best checkpoint")  # refuses one damaged since it was written
            else:
                test_ckpt = ckpt_path
                if not test_ckpt:
                    log.warning("train=false without ckpt_path: testing an untrained model")
            test_start = time.time()
            trainer.test(model, datamodule=datamodule, ckpt_path=test_ckpt, weights_only=True)
            timings["test_s"] = round(time.time() - test_start, 2)
            if received_sigterm():
                raise Terminated(signal.SIGTERM)
            test_metrics = _scalars(trainer.callback_metrics)

        metrics = {**fit_metrics, **test_metrics}
        result = {
            "metrics": metrics,
            "best_model_path": getattr(ckpt_cb, "best_model_path", None) or None,
            "best_val_acc": (float(ckpt_cb.best_model_score)
                             if getattr(ckpt_cb, "best_model_score", None) is not None else None),
            "best_epoch": _epoch_of(getattr(ckpt_cb, "best_model_path", "")),
            "epochs_run": trainer.current_epoch,
            "runtime_s": round(time.time() - start, 2),
            "timings": timings,
            "params": params,
            "provenance": run_provenance(state["code"], datamodule, trainer),  # the commit, versions, data, device
            **({"resume_changes": resume_changes} if resume_changes else {}),
            "config": {
                "data": cfg.data.get("name"), "seed": cfg.get("seed"),
                "model": {**model_kwargs, **getattr(model, "architecture", {})},  # a pretrained encoder's shape
            },
        }
        if trainer.is_global_zero:
            if history.rows:
                history.write()  # also when no epoch ran here (a resumed finished run into a new folder)
            atomic_write(output_dir / "config_resolved.yaml", OmegaConf.to_yaml(cfg, resolve=True), "config")
            # last: a folder with metrics.json holds a finished run (run_checks), everything else written
            atomic_write(output_dir / "metrics.json", json.dumps(result, indent=2), "metrics")
            log_run_end(loggers, output_dir, result)
            log.info("%s", where_things_are(output_dir, result))
        return result
    finally:
        if any(isinstance(lg, WandbLogger) for lg in loggers):
            import wandb

            wandb.finish()


def where_things_are(output_dir: Path, result: dict) -> str:
    """The end-of-run block: where the metrics, the best checkpoint and the plots are, what to run next."""
    multirun, _, _ = hydra_runtime()
    sweep_dir = output_dir.parent if multirun else output_dir
    best = result.get("best_model_path")
    score = f" (val/acc {result['best_val_acc']:.4f})" if result.get("best_val_acc") is not None else ""
    lines = [f"Run finished in {result['runtime_s']:.0f} s: {output_dir}",
             f"  metrics          {output_dir / 'metrics.json'}",
             f"  best checkpoint  {best}{score}" if best else "  best checkpoint  none (this run saved no checkpoint)"]
    if (output_dir / "identifiability").is_dir():
        lines.append(f"  identifiability  {output_dir / 'identifiability'} (probe.json, epoch_XXX/ metrics and plots)")
    if best:
        text = shlex.quote('text="a gripping, beautiful film"')  # Hydra needs the inner quotes (comma)
        lines.append(f"  analyze          python analyze.py {shlex.quote(f'ckpt_path={best}')} {text}")
    lines.append(f"  report           python -m identifiable_transformers.report {sweep_dir}")
    return "\n".join(lines)


def _epoch_of(path: str) -> int | None:
    """Checkpoints are named epoch_XXX.ckpt (conf/callbacks/model_checkpoint.yaml)."""
    stem = Path(path).stem if path else ""
    return int(stem.split("_")[1]) if stem.startswith("epoch_") and stem.split("_")[1].isdigit() else None
