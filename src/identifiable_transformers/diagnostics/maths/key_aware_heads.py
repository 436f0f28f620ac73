"""The key-aware count (key_aware.py) for every example, layer and head of a TransformerClassifier.

``head_inputs`` captures each head's queries, keys and value-output matrix T in float64; ``head_systems``
walks them cut to each example's real tokens; ``key_aware_alternative_dims`` counts every head.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .internals import _lengths_from_mask, _run_internals, value_output_matrices
from .key_aware import _F64, generatable_alternative_dim


def key_aware_unsupported(model: torch.nn.Module) -> str | None:
    """Why the key-aware count does not apply to ``model`` (a pretrained family's reason), or None."""
    return getattr(getattr(model, "family", None), "key_aware_unsupported", None)


def head_inputs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None) -> dict[str, Any]:
    """Per layer, every head's queries and keys [B, T, H, d_k] and value-output matrices T [B, H, T, d].

    Queries and keys are captured with forward hooks on each layer's ``attn.q_proj`` / ``attn.k_proj``
    while ``attention_internals`` runs (eval mode, no gradients), in float64 on the CPU.
    """
    reason = key_aware_unsupported(model)
    if reason is not None:
        raise ValueError(f"the key-aware count does not apply to this model: {reason}, so its maps are not "
                         "softmax(s Q K^T) of the query and key projections (docs/pretrained.md)")
    layers = getattr(model, "layers", None)
    if layers is None or not all(hasattr(getattr(l, "attn", None), "q_proj") for l in layers):
        raise TypeError("key-aware counts need a TransformerClassifier (layers[i].attn.q_proj/k_proj)")
    captured: dict[tuple[int, str], Tensor] = {}
    hooks = []
    for i, layer in enumerate(layers):
        for name in ("q_proj", "k_proj"):
            def hook(_mod, _inp, out, key=(i, name)):
                captured[key] = out.detach()
            hooks.append(getattr(layer.attn, name).register_forward_hook(hook))
    try:
        internals, attention_mask = _run_internals(model, input_ids, attention_mask)
    finally:
        for h in hooks:
            h.remove()
    _, T_all = value_output_matrices(internals)  # (B, L, H, T, d)
    B, L, H = T_all.shape[:3]
    dk = model.key_dim
    view = lambda x: x.to("cpu", _F64).view(B, -1, H, dk)  # noqa: E731  (B, T, H, dk)
    return {
        "lengths": _lengths_from_mask(attention_mask),
        "q": [view(captured[(l, "q_proj")]) for l in range(L)],
        "k": [view(captured[(l, "k_proj")]) for l in range(L)],
        "T": T_all,
        "shape": (B, L, H),
    }


def key_aware_alternative_dims(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None, method: str = "auto"
) -> dict[str, Any]:
    """``generatable_alternative_dim`` for every example, layer and head of a TransformerClassifier.

    Everything is restricted to each example's real tokens. Returns [B, L, H] long tensors
    ``alternative_dim``, ``key_agnostic_dim``, ``tangent_dim``, ``output_rank``, a [B, L, H] bool tensor
    ``resolved`` (margin >= UNRESOLVED_MARGIN), ``lengths`` [B], and nested lists [B][L][H] ``margin``
    (None for inf) and ``method``.
    """
    heads = head_inputs(model, input_ids, attention_mask)
    B, L, H = heads["shape"]
    keys = ("alternative_dim", "key_agnostic_dim", "tangent_dim", "output_rank")
    out: dict[str, Any] = {k: torch.zeros(B, L, H, dtype=torch.long) for k in keys}
    out["resolved"] = torch.zeros(B, L, H, dtype=torch.bool)
    margins = [[[None] * H for _ in range(L)] for _ in range(B)]
    methods = [[[None] * H for _ in range(L)] for _ in range(B)]
    for b, l, h, Q, K, T in head_systems(heads):
        res = generatable_alternative_dim(Q, K, T, method=method)
        for key in keys:
            out[key][b, l, h] = res[key]
        out["resolved"][b, l, h] = res["resolved"]
        margins[b][l][h] = res["margin"] if math.isfinite(res["margin"]) else None
        methods[b][l][h] = res["method"]
    out.update(lengths=heads["lengths"], margin=margins, method=methods)
    return out


def head_systems(heads: dict[str, Any]) -> Iterator[tuple[int, int, int, Tensor, Tensor, Tensor]]:
    """(b, l, h, Q, K, T) for every layer, example and head of ``head_inputs``, cut to the example's real tokens."""
    _, L, H = heads["shape"]
    for l in range(L):
        for b, n in enumerate(heads["lengths"].tolist()):
            for h in range(H):
                yield b, l, h, heads["q"][l][b, :n, h], heads["k"][l][b, :n, h], heads["T"][b, l, h, :n]
