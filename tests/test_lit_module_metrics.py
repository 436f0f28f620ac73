"""The logged accuracy is micro-averaged (the paper's accuracy) and F1 macro-averaged, on an unbalanced toy
set where the two averages differ; the references are computed by hand from the model's own predictions."""

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from identifiable_transformers.modules.classifier import TextClassifier

C = 3


def _toy_set(seed=0):
    n = 37
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 30, (n, 6), generator=g)
    labels = torch.tensor([0] * 26 + [1] * 7 + [2] * 4)[torch.randperm(n, generator=g)]  # unbalanced
    return [{"input_ids": ids[i], "attention_mask": torch.ones(6, dtype=torch.bool), "labels": labels[i]}
            for i in range(n)]


def _by_hand(preds, labels):
    micro = (preds == labels).double().mean().item()
    recall, f1 = [], []
    for c in range(C):
        tp = ((preds == c) & (labels == c)).sum().item()
        fp = ((preds == c) & (labels != c)).sum().item()
        fn = ((preds != c) & (labels == c)).sum().item()
        recall.append(tp / (tp + fn) if tp + fn else 0.0)
        f1.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return micro, sum(recall) / C, sum(f1) / C


def test_accuracy_is_micro_and_f1_macro_averaged(tmp_path):
    torch.manual_seed(0)
    module = TextClassifier(30, C, embed_dim=8, num_heads=2, ffn_dim=16, dropout=0.0)
    with torch.no_grad():  # lean towards the majority class, as an undertrained model does
        module.model.head.bias.copy_(torch.tensor([2.5, 0.5, 0.0]))
    data = _toy_set()
    loader = DataLoader(data, batch_size=16)  # batches of 16, 16 and 5: per-batch means would differ too
    module.eval()
    with torch.no_grad():
        preds = torch.cat([module(b["input_ids"], b["attention_mask"]).logits.argmax(-1) for b in loader])
    labels = torch.stack([r["labels"] for r in data])
    micro, macro, macro_f1 = _by_hand(preds, labels)
    batch_mean = sum((preds[i:i + 16] == labels[i:i + 16]).double().mean().item() for i in range(0, 37, 16)) / 3
    assert abs(micro - macro) > 0.05 and abs(micro - batch_mean) > 0.01, (micro, macro, batch_mean)  # meaningful
    assert len(set(preds.tolist())) > 1  # not a constant predictor

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    test = trainer.test(module, dataloaders=loader, verbose=False)[0]
    val = trainer.validate(module, dataloaders=loader, verbose=False)[0]
    for m, stage in ((test, "test"), (val, "val")):
        assert m[f"{stage}/acc"] == pytest.approx(micro, abs=1e-6)
        assert m[f"{stage}/f1"] == pytest.approx(macro_f1, abs=1e-6)


def test_the_epoch_train_loss_is_the_mean_over_real_rows(tmp_path):
    # batches of 8 rows with mean loss 1.0 and of 4 rows with mean loss 4.0: (8 * 1 + 4 * 4) / 12 = 2.0 (the mean
    # of the two batch means, 2.5, is what an unweighted mean gives)
    module = TextClassifier(30, C, embed_dim=8, num_heads=2, ffn_dim=16, dropout=0.0)
    means = iter([1.0, 4.0])

    def forward_loss(input_ids, attention_mask, labels, smoothing):
        logits = module.model(input_ids, attention_mask).logits
        return logits.sum() * 0 + next(means), logits

    module._forward_loss = forward_loss
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, max_epochs=1,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         limit_val_batches=0)
    trainer.fit(module, train_dataloaders=DataLoader(_toy_set()[:12], batch_size=8))
    assert trainer.callback_metrics["train/loss_epoch"].item() == pytest.approx(2.0)


def test_filler_rows_do_not_weigh_in_the_epoch_train_loss():
    from identifiable_transformers.modules.metrics import WeightedMean

    metric = WeightedMean()
    metric.update(torch.tensor(1.0), torch.tensor(8))
    metric.update(torch.tensor(4.0), torch.tensor(4))  # a filled batch of 8 rows, 4 of them real
    assert metric.compute().item() == pytest.approx(2.0)
    assert set(metric._defaults) == {"mean_value", "weight"}  # MeanMetric's states: old checkpoints load
