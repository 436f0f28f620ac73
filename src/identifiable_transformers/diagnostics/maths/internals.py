"""From a model's attention internals to the identifiability report (docs/identifiability.md section 2).

The per-matrix maths lives in nullspace.py; this module runs a TransformerClassifier's
``attention_internals``, forms each head's value-output matrix T = V W_o^h on the real tokens, and
groups examples by length so that T is never padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .nullspace import _EPS, _F64, HEAD_METRICS, _joint_null_dims, analyse_heads


def value_output_matrices(internals: Sequence[Any], device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Stack (attention [B, L, H, T, T], value-output T [B, L, H, T, d]) in float64 on ``device`` (None: CPU).

    T for layer l, head h is values[:, h] @ out_proj[h] (docs/identifiability.md 2: T = V W_o^h).
    """
    device = "cpu" if device is None else device
    atts, ts = [], []
    for layer in internals:
        values = layer.values.detach().to(device, _F64)  # (B, H, T, dv)
        out_proj = layer.out_proj.detach().to(device, _F64)  # (H, dv, d)
        atts.append(layer.attention.detach().to(device, _F64))  # (B, H, T, T)
        ts.append(torch.einsum("bhtv,hvd->bhtd", values, out_proj))  # (B, H, T, d)
    return torch.stack(atts, dim=1), torch.stack(ts, dim=1)


def _lengths_from_mask(attention_mask: Tensor) -> Tensor:
    mask = attention_mask.to("cpu").bool()
    lengths = mask.sum(-1)
    if (lengths == 0).any():
        bad = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"attention_mask has examples with no real token (rows {bad}); drop them first")
    prefix = torch.arange(mask.shape[-1]) < lengths.unsqueeze(-1)
    if not torch.equal(prefix, mask):
        raise ValueError(
            "attention_mask must mark real tokens as a prefix of each row (right padding); "
            "got a mask with padding before real tokens"
        )
    return lengths


def identifiability_from_internals(
    internals: Sequence[Any], attention_mask: Tensor, *, return_maps: bool = False,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """The report of ``attention_identifiability`` from already computed attention internals.

    The maths runs on ``device`` (None: the CPU); the report's tensors are returned on the CPU either way.
    """
    lengths = _lengths_from_mask(attention_mask)
    A_all, T_all = value_output_matrices(internals, device)
    dev = A_all.device
    B, L, H = A_all.shape[:3]
    d = T_all.shape[-1]
    out: dict[str, Any] = {
        k: torch.zeros(B, L, H, dtype=torch.long if k.endswith(("null_dim", "rank")) else _F64, device=dev)
        for k in (*HEAD_METRICS, "rank", "stochastic_rank", "tol", "stochastic_tol", "witness_rel_error")
    }
    out["joint_null_dim"] = torch.zeros(B, L, dtype=torch.long, device=dev)
    out["joint_stochastic_null_dim"] = torch.zeros(B, L, dtype=torch.long, device=dev)
    maps: list[dict[str, Tensor] | None] = [None] * B
    # Group examples by exact length: one batched SVD per length, and T is never padded.
    for n in lengths.unique().tolist():
        idx = (lengths == n).nonzero().flatten().to(dev)
        A = A_all[idx][..., :n, :n]  # (k, L, H, n, n)
        T = T_all[idx][..., :n, :]  # (k, L, H, n, d)
        res = analyse_heads(A, T, return_maps=return_maps)
        for key in out:
            if key in res:
                out[key][idx] = res[key].to(out[key].dtype)
        jn, jsn = _joint_null_dims(T)
        out["joint_null_dim"][idx] = jn.to(torch.long)
        out["joint_stochastic_null_dim"][idx] = jsn.to(torch.long)
        if return_maps:
            for j, b in enumerate(idx.tolist()):
                maps[b] = {k: res[k][j].cpu() for k in ("attention", "effective", "alternative", "alt_tv_rows",
                                                         "witness_rel_error")}
    out = {k: v.cpu() for k, v in out.items()}
    out["lengths"] = lengths
    # tol = sigma_max(T) * rtol with rtol = max(n, d) * eps (per example); stochastic: max(n, d+1).
    out["rtol"] = lengths.clamp_min(d).to(_F64) * _EPS
    out["eps"] = _EPS
    if return_maps:
        out["maps"] = maps
    return out


def _run_internals(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None):
    if attention_mask is None:
        attention_mask = input_ids != model.pad_id
    attention_mask = attention_mask.bool()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            internals = model.attention_internals(input_ids, attention_mask=attention_mask)
    finally:
        model.train(was_training)
    return internals, attention_mask


def attention_identifiability(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    return_maps: bool = False,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """Identifiability report for a batch (docs/identifiability.md section 2), per example, layer and head.

    Runs ``model.attention_internals`` in eval mode without gradients (the previous training
    mode is restored). ``attention_mask`` [B, T] marks real tokens (a prefix of each row); the
    default is ``input_ids != model.pad_id``. Returns a dict of [B, L, H] tensors
    (``HEAD_METRICS`` plus ``rank``, ``stochastic_rank``, ``tol``, ``stochastic_tol``,
    ``witness_rel_error``), [B, L] layer-level ``joint_null_dim`` / ``joint_stochastic_null_dim``,
    ``lengths`` [B], ``rtol`` [B] (tol = sigma_max * rtol) and, with ``return_maps``, ``maps``: per
    example a dict of [L, H, n, n] raw / effective / alternative attention maps. The attention runs where the
    model is; the float64 maths on ``device`` (None: the CPU); the report is on the CPU.
    """
    internals, attention_mask = _run_internals(model, input_ids, attention_mask)
    return identifiability_from_internals(internals, attention_mask, return_maps=return_maps, device=device)


def attention_maps(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None
) -> list[dict[str, Tensor]]:
    """Per example: raw, effective (A_eff) and witness-alternative maps [L, H, n, n] on real tokens."""
    return attention_identifiability(model, input_ids, attention_mask, return_maps=True)["maps"]


