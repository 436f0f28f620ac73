"""Noise a user cannot act on, removed narrowly: each filter matches one exact message of one library.

* Lightning's ``_pytree`` helper builds torch's deprecated ``LeafSpec``: a FutureWarning on every run, about
  Lightning's code, not ours or the user's.
* W&B warns "Images sizes do not match" when a list of images of different sizes is logged under one key
  (the identifiability plots, one per head and probe length, are meant to differ).
* Lightning's model summary counts FLOPs only with an ``example_input_array``; without one it prints a FLOPs
  column of zeros and "0 Total Flops". :class:`ModelSummary` leaves both out when nothing was counted.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from lightning.pytorch.callbacks import ModelSummary as _LightningModelSummary
from lightning.pytorch.callbacks.model_summary import log as _summary_log
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

PYTREE_MESSAGE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
WANDB_IMAGE_SIZES = "Images sizes do not match"


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def silence_known_noise() -> None:
    """Install the filters (idempotent)."""
    warnings.filterwarnings("ignore", message=PYTREE_MESSAGE, category=FutureWarning)
    root = logging.getLogger()  # wandb calls logging.warning(...), i.e. the root logger
    if not any(isinstance(f, _DropMessage) and f.prefix == WANDB_IMAGE_SIZES for f in root.filters):
        root.addFilter(_DropMessage(WANDB_IMAGE_SIZES))


class ModelSummary(_LightningModelSummary):
    """Lightning's ``ModelSummary``, without the FLOPs column and total when no FLOPs were counted."""

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        if total_flops:
            return _LightningModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                                    total_training_modes, total_flops, **summarize_kwargs)
        columns = [c for c in summary_data if c[0] != "FLOPs"]
        table = _format_summary_table(total_parameters, trainable_parameters, model_size, total_training_modes, 0,
                                      *columns)
        table = table.rsplit("\n", 1)[0]  # the "0  Total Flops" line the table always ends with
        _summary_log.info("\n" + table)
