"""Checks that a training step never makes the host wait for the device (docs/performance.md).

On CUDA, :func:`forbid_host_sync` sets ``torch.cuda.set_sync_debug_mode("error")``, which raises at any
synchronising call. On the CPU nothing synchronises, so it raises instead at every conversion of a tensor to a
Python value (``item``, ``tolist``, ``bool``, ``int``, ``float``, ``numpy``): each would be a synchronisation
on a GPU (and a stricter check: reading a CPU tensor there would be harmless).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import lightning.pytorch as pl
import torch

_CONVERSIONS = ("item", "tolist", "__bool__", "__int__", "__float__", "numpy")


class HostSyncError(RuntimeError):
    pass


@contextmanager
def forbid_host_sync(device: torch.device | str = "cpu") -> Iterator[None]:
    """Inside the block, on CUDA any synchronisation raises (torch's own check, which also lets a CPU tensor be
    read); elsewhere every tensor turned into a Python value raises ``HostSyncError``."""
    if torch.device(device).type == "cuda":
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        return
    originals = {name: getattr(torch.Tensor, name) for name in _CONVERSIONS}

    def refuse(name):
        def call(self, *args, **kwargs):
            raise HostSyncError(f"Tensor.{name}() inside a training step: on a GPU the host would wait for the device")
        return call

    try:
        for name in _CONVERSIONS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


class ForbidHostSync(pl.Callback):
    """:func:`forbid_host_sync` from the start to the end of every training batch (forward, loss, metrics,
    logging, backward, clipping, optimiser step), from batch ``skip`` on (the first steps may compile)."""

    def __init__(self, skip: int = 0):
        self.skip, self.steps, self._block = skip, 0, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx >= self.skip:
            self._block = forbid_host_sync(pl_module.device)
            self._block.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._block is not None:
            self._block.__exit__(None, None, None)
            self._block = None
            self.steps += 1

    def on_exception(self, trainer, pl_module, exception):
        if self._block is not None:
            self._block.__exit__(None, None, None)
            self._block = None
