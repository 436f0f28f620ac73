"""Mixed precision (``trainer=gpu`` is bf16-mixed) with gradient clipping: the run trains, and clips.

Lightning's mixed-precision plugin refuses to clip gradients for an optimizer that unscales them itself, as
the fused AdamW does; ``python train.py trainer=gpu`` crashed at its first step (seen on an H200). The same
plugin runs ``bf16-mixed`` on the CPU, so the CPU tests here hold for the GPU path too.
"""

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from identifiable_transformers.modules.classifier import TextClassifier


def _loader():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 30, (32, 6), generator=g)
    return DataLoader([{"input_ids": ids[i], "attention_mask": torch.ones(6, dtype=torch.bool),
                        "labels": torch.tensor(i % 3)} for i in range(32)], batch_size=8)


class _Recorder(pl.Callback):
    """The optimizer's fused flag at every step."""

    def __init__(self):
        self.fused = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.fused.append(bool(optimizer.defaults.get("fused")))


@pytest.mark.parametrize("precision, clip, fused", [
    ("bf16-mixed", 0.01, False),  # the plugin clips: the fused kernel would make it raise
    ("bf16-mixed", None, True),   # no clipping: nothing to refuse, the fused kernel stays
    ("32-true", 0.01, True),      # full precision clips any optimizer
])
def test_adamw_is_fused_unless_mixed_precision_must_clip(tmp_path, precision, clip, fused):
    torch.manual_seed(0)
    module = TextClassifier(30, 3, embed_dim=8, num_heads=2, ffn_dim=16, lr=1e-2)
    recorder = _Recorder()
    trainer = pl.Trainer(accelerator="cpu", devices=1, precision=precision, gradient_clip_val=clip, max_steps=3,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[recorder], default_root_dir=tmp_path)
    clipped = []  # the clip values the precision plugin was asked to apply (none dropped to dodge the refusal)
    plugin_clip = trainer.precision_plugin.clip_gradients
    trainer.precision_plugin.clip_gradients = lambda opt, clip_val=0.0, *args: (
        clipped.append(clip_val), plugin_clip(opt, clip_val, *args))
    before = [p.detach().clone() for p in module.parameters()]
    trainer.fit(module, train_dataloaders=_loader())
    assert trainer.global_step == 3
    assert recorder.fused == [fused] * 3
    assert clipped == [clip or 0.0] * 3
    assert any(not torch.equal(b, p) for b, p in zip(before, module.parameters()))  # it trained
