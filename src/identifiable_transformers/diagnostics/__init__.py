"""Identifiability diagnostics of attention (docs/identifiability.md section 2).

The maths lives in ``identifiability`` (pure torch). ``plots`` (matplotlib), ``callback``
(Lightning) and ``report_html`` are imported lazily so that ``import
identifiable_transformers.diagnostics`` stays light.
"""

from .identifiability import (
    HEAD_METRICS,
    alternative_attention,
    analyse_heads,
    attention_identifiability,
    attention_maps,
    effective_attention,
    generatable_alternative_dim,
    identifiability_from_internals,
    identifiable_length,
    key_aware_alternative_dims,
    matrix_rank,
    model_identifiable_length,
    null_dim,
    stochastic_null_dim,
    value_output_matrices,
)

__all__ = [
    "HEAD_METRICS",
    "IdentifiabilityCallback",
    "alternative_attention",
    "analyse_heads",
    "attention_identifiability",
    "attention_maps",
    "effective_attention",
    "generatable_alternative_dim",
    "identifiability_from_internals",
    "identifiable_length",
    "key_aware_alternative_dims",
    "matrix_rank",
    "model_identifiable_length",
    "null_dim",
    "stochastic_null_dim",
    "value_output_matrices",
]


def __getattr__(name):
    if name == "IdentifiabilityCallback":
        from .callback import IdentifiabilityCallback

        return IdentifiabilityCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
