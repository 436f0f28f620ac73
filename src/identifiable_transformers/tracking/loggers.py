"""The run's loggers and logging: W&B's mode (never blocking a run), the run's name and group from Hydra, the
flat study keys of the W&B run config, the configured Lightning loggers, and Lightning's console handlers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from ..data.sources import host_reachable

log = logging.getLogger(__name__)


def configure_wandb_mode() -> None:
    """Never let W&B block a run: log offline without an API key or without a route to W&B."""
    if os.environ.get("WANDB_MODE"):
        return
    has_key = bool(os.environ.get("WANDB_API_KEY")) or _wandb_netrc_key()
    if not has_key:
        reason = "no W&B API key is configured"
    elif not host_reachable("api.wandb.ai"):
        reason = "api.wandb.ai is unreachable"
    else:
        return
    os.environ["WANDB_MODE"] = "offline"
    log.warning("W&B logs offline because %s; upload later with `wandb sync <run dir>/wandb/offline-run-*`", reason)


def _wandb_netrc_key() -> bool:
    import netrc

    try:
        auth = netrc.netrc().authenticators("api.wandb.ai")
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def hydra_runtime() -> tuple[bool, str, str]:
    """(is_multirun, run name, group) — neutral values outside Hydra.

    The name is Hydra's ``override_dirname`` (conf/hydra/default.yaml leaves out seeds, paths and
    logger settings). The group is the sweep inside a Hydra multirun or a W&B sweep, else the
    experiment, ``<data>-<model>``.
    """
    if not HydraConfig.initialized():
        return False, "run", "single"
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    name = hc.job.override_dirname or "defaults"
    if multirun:
        group = f"sweep-{Path(hc.sweep.dir).name}"
    elif os.environ.get("WANDB_SWEEP_ID"):
        group = f"sweep-{os.environ['WANDB_SWEEP_ID']}"
    else:
        choices = hc.runtime.choices
        group = "-".join(str(choices[k]) for k in ("data", "model") if choices.get(k)) or "single"
    return multirun, name, group


def _hydra_overrides() -> dict:
    """The command line's overrides and the chosen config options, for the W&B run's config."""
    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    return {"overrides": list(hc.overrides.task), "choices": {k: v for k, v in hc.runtime.choices.items()
                                                             if k != "hydra" and not k.startswith("hydra/")}}


def log_once() -> None:
    """Lightning's package loggers print through console handlers of their own: ``lightning`` also
    passes its lines on to the root logger, so under Hydra (which gives the root a console and a file
    handler) every INFO line came twice; ``lightning.pytorch``/``lightning.fabric``, when imported
    before Hydra set up logging, print unformatted and skip the job's .log file. Keep the root's."""
    if not logging.getLogger().handlers:
        return
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
            logger.removeHandler(handler)
        logger.propagate = True


def study_keys(cfg: DictConfig) -> dict:
    """Flat run-config keys the W&B workspace groups and plots by (wandb_workspace.py): the design
    (the model config's name) and the key size actually used (key_dim null means d/h)."""
    model = cfg.model
    choice = HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None
    if "embed_dim" not in model:  # model=pretrained: the encoder's shape is known once it is loaded
        return {"design": choice or "pretrained", "key_dim": None}
    key_dim = model.get("key_dim") or model.embed_dim // model.num_heads
    return {"design": choice or model.get("head_combine"), "key_dim": int(key_dim)}


def build_loggers(cfg: DictConfig) -> list:
    _, name, group = hydra_runtime()
    loggers = []
    for conf in (cfg.get("logger") or {}).values():
        if "_target_" not in conf:
            continue
        if "WandbLogger" in conf._target_:
            configure_wandb_mode()
            extra = {"name": conf.get("name") or name, "group": conf.get("group") or group}
            extra["config"] = {**study_keys(cfg), **({"hydra": h} if (h := _hydra_overrides()) else {})}
            # partial: `config` (wandb.init's) would collide with instantiate's own first argument
            loggers.append(hydra.utils.instantiate(conf, _partial_=True)(**extra))
        else:
            loggers.append(hydra.utils.instantiate(conf))
    return loggers


def quiet_logging_errors() -> None:
    """After a full disk, the job's log file (Hydra's ``<job>.log`` handler) fails on every later line, and Python's
    logging prints a ``--- Logging error ---`` traceback for each: turn that off, so that the run ends with its one
    ``Error:`` line (``logging.raiseExceptions``; lines that can still be written are written)."""
    logging.raiseExceptions = False
