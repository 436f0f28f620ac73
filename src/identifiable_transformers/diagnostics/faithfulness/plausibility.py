"""Plausibility: do an explainer's token scores find the human (or generator) rationale? (docs/faithfulness.md)

Per example, over its scorable tokens (real, not <cls>), against ``rationale_mask`` (B, T) bool:
  rationale_auprc  area under the precision-recall curve of the scores (average precision, ties grouped
                   as in torchmetrics and sklearn; batched here, checked against torchmetrics in the tests);
  rationale_f1     token F1 of the top-k tokens of the explainer's order, k = the rationale's size.
Examples whose rationale has no scorable token get NaN (left out of the means).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_f1_score

from ._common import _order, _scorable, _top_masks

PLAUSIBILITY_METRICS = ("rationale_auprc", "rationale_f1")


def average_precision(scores: Tensor, target: Tensor, valid: Tensor) -> Tensor:
    """Average precision of each row's scores against ``target`` over its ``valid`` positions: (R, T) -> (R,).

    The step-wise area under the precision-recall curve, sum over thresholds of (R_k - R_{k-1}) P_k, with
    equal scores entering together: what torchmetrics' ``binary_average_precision`` (and sklearn's
    ``average_precision_score``) computes for one row. torchmetrics has no batched per-row form (its
    multilabel form loops over rows or bins all thresholds), and the per-epoch pass scores
    explainers x draws x probes rows, so this is the same formula on sorted rows; the tests check it
    against torchmetrics row by row. Rows without a positive give NaN.
    """
    s = torch.where(valid, scores.double(), torch.full_like(scores, -math.inf, dtype=torch.float64))
    s, idx = torch.sort(s, dim=1, descending=True)
    pos = (target & valid).gather(1, idx).double()
    ok = valid.gather(1, idx)
    tp, seen = pos.cumsum(1), ok.double().cumsum(1)
    # A threshold is the end of a run of equal scores: precision and recall are read there.
    end = ok & torch.cat([s[:, 1:] != s[:, :-1], torch.ones_like(ok[:, :1])], 1)
    tp_end = torch.where(end, tp, torch.zeros_like(tp))
    prev = torch.cat([torch.zeros_like(tp[:, :1]), tp_end[:, :-1].cummax(1).values], 1)  # tp at the last threshold
    k = pos.sum(1)
    ap = (torch.where(end, (tp - prev) * tp / seen.clamp_min(1), torch.zeros_like(tp))).sum(1) / k.clamp_min(1)
    return torch.where(k > 0, ap, torch.full_like(ap, math.nan)).float()


def plausibility_metrics(scores: dict[str, Tensor], mask: Tensor, rationale_mask: Tensor,
                         pinned: Tensor | None = None) -> dict[str, Tensor]:
    """{"name/rationale_auprc": (B,), "name/rationale_f1": (B,)} for each explainer's (B, T) scores, over the
    scorable tokens (real, not <cls>, not ``pinned``)."""
    T = mask.shape[1]
    scorable = _scorable(mask, pinned)
    target = rationale_mask.to(mask.device).bool() & scorable
    k = target.sum(1)  # (B,) rationale size
    nan = torch.full(k.shape, math.nan, device=mask.device)
    labels = torch.where(scorable, target.long(), -1)  # -1: not scored (<cls>, padding)
    out: dict[str, Tensor] = {}
    for e, s in scores.items():
        top = _top_masks(_order(s, mask, pinned), k[:, None], T)[:, 0] & scorable  # (B, T): the top-k tokens
        f1 = binary_f1_score(top.long(), labels, multidim_average="samplewise", ignore_index=-1, validate_args=False)
        out[f"{e}/rationale_auprc"] = average_precision(s, target, scorable)
        out[f"{e}/rationale_f1"] = torch.where(k > 0, f1.float(), nan)
    return out
