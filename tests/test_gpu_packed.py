"""hydra/launcher=gpu_packed + trainer=gpu_packed: N jobs per GPU, job k on GPU k mod G (docs/training.md)."""

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from identifiable_transformers.common import resolvers
from identifiable_transformers.run.config_checks import check_config


@pytest.mark.parametrize("visible,per_gpu,n_jobs", [("0,1,2", 2, 6), ("5", 4, 4), ("0,1,2,3,4,5,6,7", 4, 32)])
def test_packed_sweep_composes_and_spreads_jobs_round_robin(make_cfg, monkeypatch, visible, per_gpu, n_jobs):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    cfg = make_cfg("hydra/launcher=gpu_packed", "trainer=gpu_packed", f"jobs_per_gpu={per_gpu}", fast=False)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert cfg.hydra.launcher.n_jobs == n_jobs
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"
    check_config(cfg)  # the project's own checks accept it (jobs_per_gpu, the resolvers)
    gpus = len(visible.split(","))
    seen = []
    for k in range(2 * n_jobs):
        OmegaConf.set_readonly(cfg.hydra, False)
        with open_dict(cfg):
            cfg.hydra.job.num = k
        HydraConfig().set_config(cfg)
        seen.append(list(cfg.trainer.devices))
    assert seen == [[k % gpus] for k in range(2 * n_jobs)]
    # the first n_jobs jobs, started together, are per_gpu on each GPU
    assert sorted(d for (d,) in seen[:n_jobs]) == sorted(list(range(gpus)) * per_gpu)


def test_packed_jobs_refuses_zero():
    with pytest.raises(ValueError, match="jobs_per_gpu"):
        resolvers.packed_jobs(0)
