"""From a model's attention internals to the identifiability report (docs/identifiability.md section 2).

The per-matrix maths lives in nullspace.py; this module runs a TransformerClassifier's
``attention_internals``, forms each head's value-output matrix T = V W_o^h on the real tokens, and
groups examples by length so that T is never padded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .epsilon import epsilon_tv_metrics
from .nullspace import _EPS, _F64, HEAD_METRICS, _joint_null_dims, analyse_heads

# Per-head epsilon-identifiability (docs/identifiability.md 2.6), [B, L, H] beside HEAD_METRICS.
EPS_METRICS = ("eps_tv_1e-3", "eps_tv_1e-2", "eps_tv_bound_1e-3", "eps_tv_bound_1e-2")


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
    device: torch.device | str | None = None, say: Callable[[str], object] | None = None,
) -> dict[str, Any]:
    """The report of ``attention_identifiability`` from already computed attention internals.

    The maths runs on ``device`` (None: the CPU); the report's tensors are returned on the CPU either way.
    ``say`` (e.g. a logger's ``info``) is told as each layer is done (a 512-token MiniLM text: ~3 s a layer).
    """
    lengths = _lengths_from_mask(attention_mask)
    dev = torch.device("cpu") if device is None else torch.device(device)
    B, L = lengths.shape[0], len(internals)
    H, d = internals[0].out_proj.shape[0], internals[0].out_proj.shape[-1]
    out: dict[str, Any] = {
        k: torch.zeros(B, L, H, dtype=torch.long if k.endswith(("null_dim", "rank")) else _F64, device=dev)
        for k in (*HEAD_METRICS, *EPS_METRICS, "rank", "stochastic_rank", "tol", "stochastic_tol", "witness_rel_error")
    }
    out["joint_null_dim"] = torch.zeros(B, L, dtype=torch.long, device=dev)
    out["joint_stochastic_null_dim"] = torch.zeros(B, L, dtype=torch.long, device=dev)
    map_keys = ("attention", "effective", "alternative", "alt_tv_rows", "witness_rel_error")
    layer_maps: list[dict[str, list[Tensor]]] = [{k: [] for k in map_keys} for _ in range(B)]
    # One layer at a time (issue 39): the float64 stacks of all layers at 512 tokens take gigabytes. Every
    # quantity is per head or per layer, so the numbers are those of all layers at once.
    for l, layer in enumerate(internals):
        A_l, T_l = value_output_matrices([layer], dev)  # (B, 1, H, T, T), (B, 1, H, T, d)
        # Group examples by exact length: one batched SVD per length, and T is never padded.
        for n in lengths.unique().tolist():
            idx = (lengths == n).nonzero().flatten().to(dev)
            A = A_l[idx][..., :n, :n]  # (k, 1, H, n, n)
            T = T_l[idx][..., :n, :]  # (k, 1, H, n, d)
            res = analyse_heads(A, T, return_maps=return_maps)
            res.update(epsilon_tv_metrics(A, T, res["alt_attention_tv"]))
            for key in out:
                if key in res:
                    out[key][idx, l] = res[key][:, 0].to(out[key].dtype)
            jn, jsn = _joint_null_dims(T)
            out["joint_null_dim"][idx, l] = jn[:, 0].to(torch.long)
            out["joint_stochastic_null_dim"][idx, l] = jsn[:, 0].to(torch.long)
            if return_maps:
                for j, b in enumerate(idx.tolist()):
                    for k in map_keys:
                        layer_maps[b][k].append(res[k][j].cpu())
        del A_l, T_l
        if say is not None:
            say(f"identifiability: layer {l + 1}/{L} done ({H} heads, {B} example(s))")
    maps = [{k: torch.cat(v[k]) for k in map_keys} for v in layer_maps] if return_maps else None
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
    chunk_size: int | None = None,
    say: Callable[[str], object] | None = None,
) -> dict[str, Any]:
    """Identifiability report for a batch (docs/identifiability.md section 2), per example, layer and head.

    Runs ``model.attention_internals`` in eval mode without gradients (the previous training
    mode is restored). ``attention_mask`` [B, T] marks real tokens (a prefix of each row); the
    default is ``input_ids != model.pad_id``. Returns a dict of [B, L, H] tensors
    (``HEAD_METRICS``, ``EPS_METRICS`` (2.6) plus ``rank``, ``stochastic_rank``, ``tol``, ``stochastic_tol``,
    ``witness_rel_error``), [B, L] layer-level ``joint_null_dim`` / ``joint_stochastic_null_dim``,
    ``lengths`` [B], ``rtol`` [B] (tol = sigma_max * rtol) and, with ``return_maps``, ``maps``: per
    example a dict of [L, H, n, n] raw / effective / alternative attention maps. The attention runs where the
    model is; the float64 maths on ``device`` (None: the CPU); the report is on the CPU.

    ``chunk_size``: run the model and the maths on at most this many examples at a time, grouped by length
    (issue 39: the float64 stacks of a whole probe at 512 tokens take tens of gigabytes); None: the whole batch
    at once. Every quantity is per example and the model runs at the batch's width either way, so the report
    is the same, bit for bit. ``say``: told as each layer (of each chunk) is done.
    """
    if chunk_size is None:
        internals, attention_mask = _run_internals(model, input_ids, attention_mask)
        return identifiability_from_internals(internals, attention_mask, return_maps=return_maps, device=device,
                                              say=say)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    if attention_mask is None:
        attention_mask = input_ids != model.pad_id
    lengths = _lengths_from_mask(attention_mask)
    order = torch.argsort(lengths, stable=True)  # chunks of similar lengths: the maths cuts each to its longest
    parts = []
    for lo in range(0, len(order), chunk_size):
        idx = order[lo : lo + chunk_size]
        rows = idx.to(input_ids.device)
        # The model runs at the batch's full width, as on the whole batch: a narrower input changes its float32
        # rounding, and some reported quantities (eps_tv) jump with it.
        internals, mask = _run_internals(model, input_ids[rows], attention_mask[rows])
        parts.append((idx, identifiability_from_internals(internals, mask, return_maps=return_maps, device=device,
                                                          say=say)))
        del internals
    return merge_reports(parts, len(order))


def merge_reports(parts: Sequence[tuple[Tensor, dict[str, Any]]], size: int) -> dict[str, Any]:
    """One report of ``size`` examples from reports of some of them: (their positions [k], their report)."""
    out: dict[str, Any] = {}
    for idx, report in parts:
        for key, value in report.items():
            if key == "maps":
                slots = out.setdefault(key, [None] * size)
                for j, b in enumerate(idx.tolist()):
                    slots[b] = value[j]
            elif isinstance(value, Tensor) and value.dim() > 0:
                if key not in out:
                    out[key] = value.new_zeros(size, *value.shape[1:])
                out[key][idx] = value
            else:  # per report, the same in every part (eps)
                out[key] = value
    return out


def attention_maps(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None
) -> list[dict[str, Tensor]]:
    """Per example: raw, effective (A_eff) and witness-alternative maps [L, H, n, n] on real tokens."""
    return attention_identifiability(model, input_ids, attention_mask, return_maps=True)["maps"]


