"""Identifiability and faithfulness diagnostics of attention (docs/diagnostics.md).

The sub-packages, lowest first; each imports only the ones before it:

    maths/         null spaces, effective attention, the key-aware count, model internals (pure torch)
    faithfulness/  token explanations and their faithfulness and plausibility metrics (torch, Captum)
    render/        what draws: matplotlib figures and the HTML report
    callbacks/     the Lightning callbacks and their probe selection

The maths is this package's public API (``from identifiable_transformers.diagnostics import null_dim``), with
the context-mixing maps ``value_zeroing``, ``alti`` and ``norm_resln`` (faithfulness/context_mixing.py).
The callbacks are imported lazily so that ``import identifiable_transformers.diagnostics`` stays light.
"""

from . import maths
from .maths import *  # noqa: F403 - the maths is the package's public API

_CONTEXT_MIXING = ("alti", "norm_resln", "value_zeroing")
__all__ = [*maths.__all__, *_CONTEXT_MIXING, "FaithfulnessCallback", "IdentifiabilityCallback"]  # noqa: F405 (lazy)


def __getattr__(name):
    if name in _CONTEXT_MIXING:
        from .faithfulness import context_mixing

        return getattr(context_mixing, name)
    if name in ("IdentifiabilityCallback", "FaithfulnessCallback"):
        from . import callbacks

        return getattr(callbacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
