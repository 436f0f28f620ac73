"""ERASER comprehensiveness and sufficiency (AOPC) and the decision-flip fraction, one explainer at a time."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import _order, _pinned, _scorable, _top_masks
from .readout import _MaskedCopies

AOPC_BINS = (1, 5, 10, 20, 50)  # percent of the real tokens (ERASER, DeYoung et al. 2020)


def _erasure_metrics(model, ids: Tensor, mask: Tensor, scores: dict[str, Tensor], pred: Tensor, prob: Tensor
                     ) -> dict[str, Tensor]:
    """comprehensiveness, sufficiency (AOPC over AOPC_BINS) and flip_frac per example, for each explainer; its
    masked copies run as one batch (chunked in ``_MaskedCopies``), one explainer after another, so memory stays at
    one explainer's copies."""
    B, T = mask.shape
    dev = mask.device
    pinned = _pinned(model, ids)
    scorable = _scorable(mask, pinned)
    n = scorable.sum(1)  # (B,)
    bins = torch.tensor(AOPC_BINS, device=dev)
    counts = ((bins[None, :] * n[:, None] + 99) // 100).clamp_min(1)  # ceil(k n), at least one, exact integers
    counts = torch.minimum(counts, n[:, None])
    steps = torch.arange(1, T, device=dev).expand(B, -1)  # flip: remove the top s tokens, s = 1..n
    step_ok = steps <= n[:, None]
    cls_only = mask & ~scorable  # <cls> and the pinned tokens: never removed

    K = len(AOPC_BINS)
    has = n > 0
    nan = torch.full((B,), math.nan, device=dev)
    keep = torch.cat([torch.ones(B, K, dtype=torch.bool, device=dev), step_ok], dim=1)
    b, s_idx = keep.nonzero(as_tuple=True)  # the copies each explainer runs: its K bins and its n prefixes
    copies = _MaskedCopies(model, ids)  # built once: the one-layer shortcut's projections serve every explainer
    out: dict[str, Tensor] = {}
    for name, s in scores.items():  # one explainer at a time: its copies' masks are (copies, T) bools
        order = _order(s, mask, pinned)
        top = _top_masks(order, counts, T) & scorable[:, None, :]  # (B, K, T)
        suff = cls_only[:, None, :] | top  # keep only the top tokens (and <cls>)
        # Removing the top s tokens, s = 1..n, is the flip curve; comprehensiveness reads it at s = counts.
        prefix = _top_masks(order, steps, T) & scorable[:, None, :]  # (B, T-1, T)
        flip = mask[:, None, :] & ~prefix
        both = torch.cat([suff, flip], dim=1)  # (B, K + T - 1, T)
        p = copies(b, both[b, s_idx])
        del top, suff, prefix, flip, both
        grid = torch.full((B, K + T - 1, p.shape[-1]), math.nan, device=dev)
        grid[b, s_idx] = p
        p_pred = grid.gather(2, pred[:, None, None].expand(-1, grid.shape[1], 1)).squeeze(-1)  # (B, S)
        removed = p_pred[:, K:].gather(1, (counts - 1).clamp_min(0))  # (B, K): without the top counts tokens
        out[f"{name}/comprehensiveness"] = torch.where(has, (prob[:, None] - removed).mean(1), nan)
        out[f"{name}/sufficiency"] = torch.where(has, (prob[:, None] - p_pred[:, :K]).mean(1), nan)
        flipped = (grid[:, K:].argmax(-1) != pred[:, None]) & step_ok  # (B, T-1)
        first = torch.where(flipped.any(1), flipped.float().argmax(1) + 1, n).float()
        out[f"{name}/flip_frac"] = torch.where(has, first / n.clamp_min(1), nan)
    return out
