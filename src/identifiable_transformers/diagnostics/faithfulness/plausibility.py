"""Plausibility: do an explainer's token scores find the human (or generator) rationale? (docs/faithfulness.md)

Per example, over its scorable tokens (real, not <cls>), against ``rationale_mask`` (B, T) bool:
  rationale_auprc  area under the precision-recall curve of the scores (average precision, ties grouped
                   as in sklearn's average_precision_score), torchmetrics;
  rationale_f1     token F1 of the top-k tokens of the explainer's order, k = the rationale's size.
Examples whose rationale has no scorable token get NaN (left out of the means).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_f1_score, multilabel_average_precision

from ._common import _order, _scorable, _top_masks

PLAUSIBILITY_METRICS = ("rationale_auprc", "rationale_f1")


def rationale_mask(rationales, width: int) -> Tensor:
    """Token positions per example (list of lists, the data's ``rationale`` column) -> (B, width) bool mask."""
    out = torch.zeros(len(rationales), width, dtype=torch.bool)
    for b, positions in enumerate(rationales):
        bad = [int(j) for j in positions if not 0 <= int(j) < width]
        if bad:
            raise ValueError(f"rationale positions {bad} of example {b} are outside its {width} tokens")
        out[b, [int(j) for j in positions]] = True
    return out


def _dense_ranks(scores: Tensor, valid: Tensor) -> Tensor:
    """Per row, the dense rank of each score (equal scores share a rank; invalid positions rank lowest)."""
    s = torch.where(valid, scores.double(), torch.full_like(scores, -math.inf, dtype=torch.float64))
    sorted_s, idx = torch.sort(s, dim=1)
    new = torch.ones_like(sorted_s, dtype=torch.long)
    new[:, 1:] = (sorted_s[:, 1:] != sorted_s[:, :-1]).long()
    ranks = torch.empty_like(idx)
    ranks.scatter_(1, idx, new.cumsum(1) - 1)
    return ranks


def plausibility_metrics(scores: dict[str, Tensor], mask: Tensor, rationale_mask: Tensor) -> dict[str, Tensor]:
    """{"name/rationale_auprc": (B,), "name/rationale_f1": (B,)} for each explainer's (B, T) scores."""
    B, T = mask.shape
    scorable = _scorable(mask)
    target = rationale_mask.to(mask.device).bool() & scorable
    k = target.sum(1)  # (B,) rationale size
    has = k > 0
    nan = torch.full((B,), math.nan)
    out: dict[str, Tensor] = {}
    if not scores:
        return out
    names = list(scores)
    # Average precision depends only on each example's order of scores (with ties). Mapping every score to
    # its dense rank on a grid of T values lets one exact, vectorised torchmetrics call (those T values as
    # its thresholds) score all examples of all explainers at once: one "label" per (explainer, example).
    grid = torch.linspace(0.0, 1.0, T)
    preds = torch.cat([grid[_dense_ranks(scores[e].cpu(), scorable.cpu())][has.cpu()] for e in names])  # (E b, T)
    labels = torch.where(scorable, target.long(), torch.full_like(target, -1, dtype=torch.long)).cpu()[has.cpu()]
    labels = labels.repeat(len(names), 1)  # (E b, T); -1 = not scored
    if len(labels):
        ap = multilabel_average_precision(preds.T, labels.T, num_labels=len(labels), average="none",
                                          thresholds=grid, ignore_index=-1, validate_args=False).view(len(names), -1)
    for i, e in enumerate(names):
        auprc = nan.clone()
        if len(labels):
            auprc[has.cpu()] = ap[i].float()
        top = _top_masks(_order(scores[e], mask), k[:, None], T)[:, 0] & scorable  # (B, T): top-k tokens
        f1 = binary_f1_score(top.long(), torch.where(scorable, target.long(), -1), multidim_average="samplewise",
                             ignore_index=-1, validate_args=False).float().cpu()
        out[f"{e}/rationale_auprc"] = auprc.to(mask.device)
        out[f"{e}/rationale_f1"] = torch.where(has.cpu(), f1, nan).to(mask.device)
    return out
