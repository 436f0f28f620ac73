"""The factorial sweep preset (issue 41) composes to the documented 2x2 design on both tasks, carries its margins,
runs seed by seed, lets the command line narrow it to one task and key size, and its arms are the designs they
stand for: concat/16 has the parameters of model=baseline and add/64 those of model=identifiable (same key size).
Expected values are written out here from the issue, not read from the preset."""

import hydra
import pytest
from omegaconf import OmegaConf

MARGINS = {"comprehensiveness": 0.02, "sufficiency": 0.005, "rationale_auprc": 0.01, "rationale_f1": 0.02,
           "tau_loo": 0.1, "adversarial_tv": 0.05, "test_acc": 0.01}


def test_factorial_preset_is_the_2x2_on_both_tasks_with_its_margins(make_cfg, sweep_jobs):
    cfg = make_cfg("+sweep=factorial", fast=False)
    assert OmegaConf.to_container(cfg.report.equivalence_margins) == MARGINS
    assert cfg.trainer.max_epochs == cfg.callbacks.faithfulness.every_n_epochs \
        == cfg.callbacks.identifiability.every_n_epochs == 8   # diagnostics on the last epoch
    assert cfg.callbacks.identifiability.probe_size == 256 and cfg.callbacks.faithfulness.final is True
    jobs = sweep_jobs(cfg)
    assert len(jobs) == 160
    assert [int(j["seed"]) for j in jobs] == sorted(int(j["seed"]) for j in jobs)  # seed outermost
    cells = {(j["data"], j["model.key_dim"], j["model.head_combine"], j["model.value_dim"]) for j in jobs[:16]}
    assert cells == {(d, k, c, v) for d in ("synthetic_contrast", "synthetic_contrast_pair") for k in ("2", "8")
                     for c in ("concat", "add") for v in ("16", "64")}
    # the lead's first call: one task, key size 2 only (a command-line key replaces the preset's sweep of it)
    first = sweep_jobs(cfg, "data=synthetic_contrast_pair", "model.key_dim=2")
    assert len(first) == 40 and {(j["data"], j["model.key_dim"]) for j in first} == {("synthetic_contrast_pair", "2")}


@pytest.mark.parametrize("data", ["synthetic_contrast", "synthetic_contrast_pair"])
def test_factorial_arms_are_the_designs(make_cfg, data):
    def params(*overrides):
        cfg = make_cfg(*overrides, fast=False)
        model = hydra.utils.instantiate(cfg.model, vocab_size=50, num_classes=4, _convert_="all").model
        return cfg, model, {k: tuple(v.shape) for k, v in model.state_dict().items()}

    arm = ("+sweep=factorial", f"data={data}", "model.key_dim=2")
    for combine, value_dim, design in (("concat", 16, "baseline"), ("add", 64, "identifiable")):
        cfg, model, shapes = params(*arm, f"model.head_combine={combine}", f"model.value_dim={value_dim}")
        assert cfg.data.name == data and cfg.data.max_length == 64
        assert (model.head_combine, model.key_dim, model.value_dim) == (combine, 2, value_dim)
        _, ref, ref_shapes = params(f"data={data}", f"model={design}", "model.key_dim=2")
        assert (ref.head_combine, ref.value_dim) == (combine, value_dim) and shapes == ref_shapes
    for combine, value_dim in (("concat", 64), ("add", 16)):  # the two arms that change one factor each
        _, model, _ = params(*arm, f"model.head_combine={combine}", f"model.value_dim={value_dim}")
        assert (model.head_combine, model.value_dim) == (combine, value_dim)


def test_rank_arm_preset_is_concat_16_capped_at_rank_16_with_the_factorials_settings(make_cfg, sweep_jobs):
    cfg = make_cfg("+sweep=factorial_rank", fast=False)
    assert OmegaConf.to_container(cfg.report.equivalence_margins) == MARGINS
    assert cfg.trainer.max_epochs == 8 and cfg.callbacks.identifiability.probe_size == 256
    jobs = sweep_jobs(cfg)
    assert len(jobs) == 20 and [int(j["seed"]) for j in jobs] == sorted(int(j["seed"]) for j in jobs)
    assert {(j["data"], j["model.key_dim"], j["model.head_combine"], j["model.value_dim"], j["model.out_rank"])
            for j in jobs} == {(d, "2", "concat", "16", "16") for d in ("synthetic_contrast", "synthetic_contrast_pair")}
    # the arm is concat/16 with a rank-16 output projection: 64 x 64 weights become 64 x 16 + 16 x 64 factors
    built = {}
    for rank in ("null", "16"):
        arm = make_cfg("+sweep=factorial_rank", "model.key_dim=2", "model.head_combine=concat", "model.value_dim=16",
                       f"model.out_rank={rank}", fast=False)
        model = hydra.utils.instantiate(arm.model, vocab_size=50, num_classes=4, _convert_="all").model
        built[rank] = sum(p.numel() for p in model.parameters())
    assert built["null"] - built["16"] == 64 * 64 - 2 * 64 * 16
