"""The quick presets are quick: the end-of-fit faithfulness stage (integrated gradients, adversarial search:
minutes on a CPU) is off in every ``debug=*`` preset and in ``+sweep=smoke``, and the per-epoch diagnostics run at a
small scale; a command-line value still wins, and with no callbacks the presets add none."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from identifiable_transformers.run.config_checks import check_config
from identifiable_transformers.run.training import _instantiate_dict

ROOT = Path(__file__).resolve().parents[1]
QUICK = [f"debug={p.stem}" for p in sorted((ROOT / "conf" / "debug").glob("*.yaml"))] + ["+sweep=smoke"]


@pytest.mark.parametrize("preset", QUICK)
def test_the_end_of_fit_stage_is_off(make_cfg, preset):
    cfg = make_cfg(preset, fast=False)
    assert cfg.callbacks.faithfulness.final is False
    (callback,) = [c for c in _instantiate_dict(cfg.callbacks) if type(c).__name__ == "FaithfulnessCallback"]
    assert callback.final is False  # what the callback's on_fit_end reads
    ident = cfg.callbacks.identifiability
    assert (ident.probe_size, ident.key_aware_max_length, cfg.callbacks.faithfulness.random_draws) == (8, 32, 2)
    assert make_cfg(preset, "callbacks.faithfulness.final=true", fast=False).callbacks.faithfulness.final is True


@pytest.mark.parametrize("preset", QUICK)
def test_without_callbacks_the_presets_add_none(make_cfg, preset):
    cfg = make_cfg(preset, "callbacks=none", fast=False)
    check_config(cfg)
    assert _instantiate_dict(cfg.callbacks) == []
    assert OmegaConf.select(cfg, "callbacks.faithfulness._target_") is None
