"""Classification metrics whose per-step update never waits for the device (docs/performance.md).

torchmetrics' own ``update`` checks its inputs' values and, with ``ignore_index``, drops rows by a boolean
index; its macro path counts with ``torch.bincount``, which on CUDA reads the input's maximum on the host. Each
of these makes the host wait for the GPU inside every training step. These subclasses keep torchmetrics'
states (``tp``, ``fp``, ``tn``, ``fn``: checkpoints keep their keys) and its ``compute``, and count with
fixed-size tensor ops only: rows labelled ``IGNORE_INDEX`` (the padding rows of a fixed-size batch) count for
nothing.
"""

from __future__ import annotations

import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from ..data.batching import IGNORE_INDEX  # -100, F.cross_entropy's default: a padding row's label


def _counts(logits: torch.Tensor, target: torch.Tensor, num_classes: int, micro: bool):
    """(tp, fp, tn, fn) of argmax(logits) against target, rows with target == IGNORE_INDEX left out: scalars
    (micro) or per class (macro), the same as torchmetrics' ``_multiclass_stat_scores_update``."""
    preds = logits.argmax(-1) if logits.dim() == target.dim() + 1 else logits
    valid = (target != IGNORE_INDEX).long()
    target = target.clamp_min(0)
    if micro:
        tp = ((preds == target).long() * valid).sum()
        fp = ((preds != target).long() * valid).sum()
        return tp, fp, num_classes * valid.sum() - (fp + fp + tp), fp
    c = num_classes
    confmat = torch.zeros(c * c, dtype=torch.long, device=target.device)
    confmat = confmat.scatter_add_(0, target * c + preds, valid).view(c, c)  # rows: target, columns: prediction
    tp = confmat.diag()
    fp, fn = confmat.sum(0) - tp, confmat.sum(1) - tp
    return tp, fp, confmat.sum() - (fp + fn + tp), fn


class _SyncFreeUpdate:
    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        tp, fp, tn, fn = _counts(preds, target, self.num_classes, self.average == "micro")
        self._update_state(tp, fp, tn, fn)


class Accuracy(_SyncFreeUpdate, MulticlassAccuracy):
    """``MulticlassAccuracy`` (micro by default: the paper's accuracy), sync-free, padding rows ignored."""

    def __init__(self, num_classes: int, average: str = "micro"):
        super().__init__(num_classes, average=average, ignore_index=IGNORE_INDEX, validate_args=False)


class F1Score(_SyncFreeUpdate, MulticlassF1Score):
    """``MulticlassF1Score`` (macro by default), sync-free, padding rows ignored."""

    def __init__(self, num_classes: int, average: str = "macro"):
        super().__init__(num_classes, average=average, ignore_index=IGNORE_INDEX, validate_args=False)


class WeightedMean(MeanMetric):
    """The mean of ``value`` weighted by ``weight`` (a batch's mean loss by its real rows), with no NaN check: the
    check would make the host wait for the device at every step (a NaN then shows in the mean). torchmetrics'
    ``MeanMetric(nan_strategy="disable")`` replaces every weight with 1 (an unweighted mean of the batches); this
    keeps its states (``mean_value``: the weighted sum, ``weight``), so checkpoints keep their keys."""

    def update(self, value: torch.Tensor | float, weight: torch.Tensor | float = 1.0) -> None:
        value = torch.as_tensor(value, device=self.device).to(self.dtype)
        weight = torch.broadcast_to(torch.as_tensor(weight, device=self.device).to(self.dtype), value.shape)
        self.mean_value += (value * weight).sum()
        self.weight += weight.sum()
