"""OmegaConf resolvers of the project's configs, registered when the package is imported.

``${packed_gpu:}`` and ``${packed_jobs:N}`` serve ``hydra/launcher=gpu_packed`` (docs/training.md): a sweep
runs N jobs per GPU at once, and job k trains on GPU k mod G of the node's G GPUs (round-robin).
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf


def node_gpus() -> int:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else torch's count (at least 1)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return max(1, len([d for d in visible.split(",") if d.strip()]))
    import torch

    return max(1, torch.cuda.device_count())


def packed_jobs(jobs_per_gpu) -> int:
    """How many sweep jobs run at once: ``jobs_per_gpu`` on each of the node's GPUs."""
    if int(jobs_per_gpu) < 1:
        raise ValueError(f"hydra.launcher.jobs_per_gpu={jobs_per_gpu} must be >= 1")
    return int(jobs_per_gpu) * node_gpus()


def packed_gpu(job_num=None) -> list[int]:
    """``trainer.devices`` of sweep job ``job_num`` (default: this job's ``hydra.job.num``): [job_num mod G]."""
    if job_num is None:
        from hydra.core.hydra_config import HydraConfig

        job_num = HydraConfig.get().job.num if HydraConfig.initialized() else 0
    return [int(job_num) % node_gpus()]


def register() -> None:
    for name, fn in (("packed_jobs", packed_jobs), ("packed_gpu", packed_gpu)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register()
