"""data.on_device and data.static_shapes: the same batches as the DataLoader, padding rows out of the loss and
the metrics, exact resume (docs/performance.md)."""

import pytest
import torch
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from identifiable_transformers.data.batching import IGNORE_INDEX, bucket_lengths
from identifiable_transformers.modules.classifier import TextClassifier
from identifiable_transformers.run.training import run


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k


def _two(local_dm, make_rows, **kw):
    rows = make_rows(45)  # 36 training rows, batch 8: a short last batch of 4
    host = local_dm(rows, shuffle_seed=3, **kw)
    dev = local_dm(rows, shuffle_seed=3, on_device=True, **kw)
    for d in (host, dev):
        d.prepare_data(), d.setup("fit")
    return host, dev


@pytest.mark.parametrize("kw", [{}, {"length_bucketing": True}, {"static_shapes": True, "length_buckets": [4, 8]},
                                {"static_shapes": True, "length_bucketing": True}])
def test_device_batches_are_the_dataloaders_batches(local_dm, make_rows, kw):
    host, dev = _two(local_dm, make_rows, **kw)
    for epoch in range(2):  # the order changes per epoch, the same way
        h, d = host.train_dataloader(), dev.train_dataloader()
        h.sampler.set_epoch(epoch), d.sampler.set_epoch(epoch)
        hb, db = list(h), list(d)
        assert len(d) == len(h) == len(hb)
        _same(db, hb)
    _same(list(dev.val_dataloader()), list(host.val_dataloader()))
    if kw.get("static_shapes"):
        assert {b["input_ids"].shape[0] for b in hb} == {8}  # the last batch filled, not dropped
        assert sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in hb) == len(host.train_dataset)
        assert {b["input_ids"].shape[1] for b in hb} <= set(bucket_lengths(32, kw.get("length_buckets")))


def test_device_batches_resume_mid_epoch_where_the_dataloader_does(local_dm, make_rows):
    host, dev = _two(local_dm, make_rows, length_bucketing=True)
    h = host.train_dataloader()
    h.sampler.set_epoch(1)
    whole = list(h)
    for d in (host, dev):
        d.load_state_dict({"label_names": d.label_names, "train_position": {"epoch": 1, "samples": 16,
                                                                            "world_size": 1}})
    _same(list(dev.train_dataloader()), whole[2:])
    _same(list(host.train_dataloader()), whole[2:])


def test_bucket_lengths():
    assert bucket_lengths(256) == [32, 64, 128, 256]
    assert bucket_lengths(100, [64, 16]) == [16, 64, 100]
    with pytest.raises(ValueError, match="length_buckets"):
        bucket_lengths(64, [128])


def test_on_device_refuses_workers(local_dm):
    with pytest.raises(ValueError, match="num_workers=0"):
        local_dm(on_device=True, num_workers=2)


def test_a_filled_batch_has_the_loss_and_metrics_of_the_batch_without_its_padding(local_dm, make_rows):
    """The padded columns (to the bucket) and the filler rows change neither the loss nor the metrics:
    against the same model on the unpadded batch, with torchmetrics' own classes as the reference."""
    plain, static = (local_dm(make_rows(45), shuffle_seed=3, **kw) for kw in ({}, {"static_shapes": True}))
    for d in (plain, static):
        d.prepare_data(), d.setup("fit")
    rows = [plain.train_dataset[i] for i in range(5)]
    small, big = plain.collate(rows), static.collate(rows, fill_to=8)
    assert big["input_ids"].shape == (8, 32) and small["input_ids"].shape[1] < 32
    torch.manual_seed(0)
    lit = TextClassifier(plain.vocab_size, plain.num_classes, embed_dim=16, num_heads=2, ffn_dim=32).eval()
    with torch.no_grad():
        loss, logits = lit._forward_loss(small["input_ids"], small["attention_mask"], small["labels"], 0.1)
        loss_big, logits_big = lit._forward_loss(big["input_ids"], big["attention_mask"], big["labels"], 0.1)
    torch.testing.assert_close(loss_big, loss)
    torch.testing.assert_close(logits_big[:5], logits, atol=1e-6, rtol=1e-5)
    lit.val_metrics.update(logits_big, big["labels"])
    got = lit.val_metrics.compute()
    c = plain.num_classes
    ref_acc = MulticlassAccuracy(c, average="micro")(logits, small["labels"])
    ref_f1 = MulticlassF1Score(c, average="macro")(logits, small["labels"])
    assert float(got["val/acc"]) == pytest.approx(float((logits.argmax(-1) == small["labels"]).float().mean()))
    torch.testing.assert_close(got["val/acc"], ref_acc)
    torch.testing.assert_close(got["val/f1"], ref_f1)


RESUME = ["trainer.max_epochs=2", "trainer.deterministic=true", "callbacks=[last_checkpoint]",
          "callbacks.last_checkpoint.every_n_train_steps=3", "model.dropout=0.3", "test=false",
          "data.on_device=true", "data.static_shapes=true", "data.length_bucketing=true"]


def test_on_device_static_shapes_resume_bit_exact(make_cfg, tmp_path, run_killed_at):
    straight = run(make_cfg(*RESUME, out="straight"))
    run_killed_at(make_cfg(*RESUME, out="killed"), 7)
    ckpt = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    resumed = run(make_cfg(*RESUME, f"ckpt_path={ckpt}", out="resumed"))
    assert resumed["metrics"] == straight["metrics"]
    a, b = ((torch.load(tmp_path / r / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"])
            for r in ("straight", "resumed"))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
