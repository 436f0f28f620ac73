"""Identifiability diagnostics of attention (docs/identifiability.md section 2).

The maths lives in ``identifiability`` (pure torch). ``plots`` (matplotlib), ``callback``
(Lightning) and ``report_html`` are imported lazily so that ``import
identifiable_transformers.diagnostics`` stays light.
"""

from . import identifiability
from .identifiability import *  # noqa: F403 - the maths is the package's public API

__all__ = [*identifiability.__all__, "IdentifiabilityCallback"]


def __getattr__(name):
    if name == "IdentifiabilityCallback":
        from .callback import IdentifiabilityCallback

        return IdentifiabilityCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
