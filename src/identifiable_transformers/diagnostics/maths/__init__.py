"""The maths of the diagnostics: pure torch, no Lightning, no plotting (docs/identifiability.md section 2).

Layers, lowest first; a module imports only modules above it in this list:

    nullspace.py        rank with a tolerance, null spaces, effective attention, witnesses (A, T only)
    key_aware.py        the key-aware count of alternatives for one head (Q, K, T; section 2.5)
    internals.py        a model's per-head T and A on a batch; the model-level identifiability report
    key_aware_heads.py  the key-aware count for every head of a model
    equivalence.py      equivalence-class ranges: least and greatest w . a' over a row's output-equivalent rows (LPs)
"""

from .equivalence import equivalence_range, equivalence_ranges
from .internals import (
    attention_identifiability,
    attention_maps,
    identifiability_from_internals,
    value_output_matrices,
)
from .key_aware import generatable_alternative_dim
from .key_aware_heads import key_aware_alternative_dims
from .nullspace import (
    HEAD_METRICS,
    alternative_attention,
    analyse_heads,
    effective_attention,
    identifiable_length,
    matrix_rank,
    model_identifiable_length,
    null_dim,
    stochastic_null_dim,
)

__all__ = [
    "HEAD_METRICS",
    "alternative_attention",
    "analyse_heads",
    "attention_identifiability",
    "attention_maps",
    "effective_attention",
    "equivalence_range",
    "equivalence_ranges",
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
