"""Load any checkpoint train.py writes, whichever model it holds (analyze.py, the report)."""

from __future__ import annotations

import os

from .modules.checkpoint import read_checkpoint


def load_module(path: str | os.PathLike, map_location: str = "cpu"):
    """A ``TextClassifier``, or a ``PretrainedTextClassifier`` for a ``model=pretrained`` checkpoint."""
    ckpt, _ = read_checkpoint(path)
    if "name_or_path" in (ckpt.get("hyper_parameters") or {}):
        from .hf.module import PretrainedTextClassifier as cls
    else:
        from .modules.classifier import TextClassifier as cls
    return cls.load_from_checkpoint(str(path), map_location=map_location)
