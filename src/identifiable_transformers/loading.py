"""Load any checkpoint train.py writes, whichever model it holds (analyze.py, the report), or a Hugging Face
classifier as it is (``load_hf_classifier``: a hub id or a save_pretrained folder, no training)."""

from __future__ import annotations

import os

from .modules.checkpoint import read_checkpoint

__all__ = ["load_hf_classifier", "load_module"]


def load_hf_classifier(name_or_path: str, **kwargs):
    """``(model, tokenizer)`` of a Hugging Face checkpoint, its own head kept (``hf.sequence_classifier``)."""
    from .hf.sequence_classifier import load_hf_classifier as load

    return load(name_or_path, **kwargs)


def load_module(path: str | os.PathLike, map_location: str = "cpu"):
    """A ``TextClassifier``, or a ``PretrainedTextClassifier`` for a ``model=pretrained`` checkpoint."""
    ckpt, _ = read_checkpoint(path)
    if "name_or_path" in (ckpt.get("hyper_parameters") or {}):
        from .hf.module import PretrainedTextClassifier as cls
    else:
        from .modules.classifier import TextClassifier as cls
    return cls.load_from_checkpoint(str(path), map_location=map_location)
