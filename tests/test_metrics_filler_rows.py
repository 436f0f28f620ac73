"""The sync-free metrics leave out the filler rows of a static-shape batch (label IGNORE_INDEX): a hand-made batch
of 5 real rows and 3 filler rows whose logits all point to class 2 scores exactly what torchmetrics gives on the 5
real rows alone, and what the per-class counts give by hand."""

import torch
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

from identifiable_transformers.data.batching import IGNORE_INDEX
from identifiable_transformers.modules.metrics import Accuracy, F1Score

TARGET = torch.tensor([0, 0, 1, 2, 2])
PREDS = torch.tensor([0, 1, 1, 2, 0])
# per class (tp, fp, fn): 0: (1, 1, 1) -> 1/2; 1: (1, 1, 0) -> 2/3; 2: (1, 0, 1) -> 2/3
MACRO_F1 = (1 / 2 + 2 / 3 + 2 / 3) / 3  # 0.611
ACCURACY = 3 / 5


def _filled_batch():
    logits = torch.nn.functional.one_hot(torch.cat([PREDS, torch.tensor([2, 2, 2])]), 3).float()
    target = torch.cat([TARGET, torch.full((3,), IGNORE_INDEX)])
    return logits, target


def test_filler_rows_count_for_nothing_in_macro_f1_and_accuracy():
    logits, target = _filled_batch()
    f1, acc = F1Score(3), Accuracy(3)
    f1.update(logits, target)
    acc.update(logits, target)
    reference_f1 = float(multiclass_f1_score(PREDS, TARGET, num_classes=3, average="macro"))
    reference_acc = float(multiclass_accuracy(PREDS, TARGET, num_classes=3, average="micro"))
    assert abs(reference_f1 - MACRO_F1) < 1e-6 and abs(reference_acc - ACCURACY) < 1e-6
    assert abs(float(f1.compute()) - MACRO_F1) < 1e-6
    assert abs(float(acc.compute()) - ACCURACY) < 1e-6


def test_macro_accuracy_and_micro_f1_leave_them_out_too():
    logits, target = _filled_batch()
    for metric, reference in ((Accuracy(3, average="macro"), multiclass_accuracy(PREDS, TARGET, 3, average="macro")),
                              (F1Score(3, average="micro"), multiclass_f1_score(PREDS, TARGET, 3, average="micro"))):
        metric.update(logits, target)
        assert abs(float(metric.compute()) - float(reference)) < 1e-6
