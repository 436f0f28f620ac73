"""A training step (forward, loss, metrics, logging, backward, clipping, AdamW, scheduler) turns no tensor into a
Python value: on a GPU it would never wait for the device (issue 29, docs/performance.md)."""

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from identifiable_transformers.modules import classifier as lit_module
from identifiable_transformers.modules.classifier import TextClassifier
from identifiable_transformers.modules.metrics import IGNORE_INDEX
from identifiable_transformers.modules.sync_check import ForbidHostSync, HostSyncError, forbid_host_sync


def _batches(n=4, b=6, t=9, vocab=40, padded_rows=0):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        lengths = torch.randint(2, t + 1, (b,), generator=g)
        mask = torch.arange(t)[None] < lengths[:, None]
        ids = torch.randint(2, vocab, (b, t), generator=g).masked_fill(~mask, 0)
        labels = torch.randint(0, 3, (b,), generator=g)
        if padded_rows:
            labels[-padded_rows:] = IGNORE_INDEX
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def test_the_check_catches_each_conversion():
    x = torch.ones(2)
    for convert in (lambda: x.sum().item(), lambda: x.tolist(), lambda: bool(x.all()), lambda: int(x[0]),
                    lambda: float(x[0]), lambda: x.numpy()):
        with forbid_host_sync(), pytest.raises(HostSyncError):
            convert()
    assert x.sum().item() == 2.0  # restored


@pytest.mark.parametrize("head_combine,key_dim", [("concat", None), ("add", 2)])
def test_a_training_step_never_waits_for_the_device(head_combine, key_dim, tmp_path):
    torch.manual_seed(0)
    model = TextClassifier(40, 3, embed_dim=16, num_heads=2, key_dim=key_dim, head_combine=head_combine,
                           ffn_dim=32, dropout=0.3, scheduler="linear", warmup_steps=2, label_smoothing=0.1)
    check = ForbidHostSync()
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, gradient_clip_val=1.0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=1, callbacks=[check], default_root_dir=tmp_path)
    trainer.fit(model, DataLoader(_batches(padded_rows=1), batch_size=None))
    assert check.steps == 4
    assert torch.isfinite(trainer.callback_metrics["train/loss_epoch"])


def test_the_graphed_step_traces_as_one_graph_and_matches_eager(monkeypatch, tmp_path):
    """model.cuda_graphs compiles the training forward with fullgraph=True (here with the eager backend on the
    CPU): it traces in one graph and trains exactly as the eager step, with the same dropout masks."""
    monkeypatch.setattr(lit_module, "_GRAPH_DEVICES", ("cpu",))
    monkeypatch.setattr(lit_module, "_GRAPH_COMPILE", {"backend": "eager", "fullgraph": True, "dynamic": False})
    weights = []
    for graphs in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(1)
        model = TextClassifier(40, 3, embed_dim=16, num_heads=2, key_dim=2, head_combine="add", ffn_dim=32,
                               dropout=0.3, cuda_graphs=graphs)
        trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        trainer.fit(model, DataLoader(_batches(padded_rows=2), batch_size=None))
        assert (model._graphed_loss is not None) == graphs
        weights.append(model.model.state_dict())
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k], weights[0][k], rtol=0, atol=0, msg=k)


def test_cuda_graphs_is_ignored_on_the_cpu_with_a_warning_and_excludes_compile(tmp_path):
    model = TextClassifier(40, 3, embed_dim=16, num_heads=2, ffn_dim=32, cuda_graphs=True)
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match="cuda_graphs=true has no effect on cpu"):
        trainer.fit(model, DataLoader(_batches(n=1), batch_size=None))
    assert model._graphed_loss is None
    with pytest.raises(ValueError, match="exclude each other"):
        TextClassifier(40, 3, embed_dim=16, num_heads=2, compile=True, cuda_graphs=True)


def test_cuda_graphs_refuses_gradient_accumulation(monkeypatch, tmp_path):
    monkeypatch.setattr(lit_module, "_GRAPH_DEVICES", ("cpu",))
    model = TextClassifier(40, 3, embed_dim=16, num_heads=2, ffn_dim=32, cuda_graphs=True)
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, accumulate_grad_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    with pytest.raises(ValueError, match="accumulate_grad_batches=2"):
        trainer.fit(model, DataLoader(_batches(n=2), batch_size=None))
