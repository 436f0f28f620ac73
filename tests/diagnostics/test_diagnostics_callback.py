"""IdentifiabilityCallback inside a real (tiny, CPU) Lightning fit."""

import csv
import json

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from diag_helpers import VOCAB, TinyData, TinyModule, word_tokenizer
from lightning.pytorch.loggers import CSVLogger

from identifiable_transformers.diagnostics.callbacks.identifiability import (
    IdentifiabilityCallback,
    select_probe_indices,
)


def _rows(n_rows, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        n = int(rng.integers(2, 30))
        rows.append({"input_ids": [2] + rng.permutation(np.arange(3, VOCAB))[: n - 1].tolist(),
                     "labels": int(rng.integers(0, 2))})
    return rows


def tiny_data():
    return TinyData(_rows(32, 0), _rows(40, 1), tokenizer=word_tokenizer())


def tiny_module(head_combine="concat", key_dim=2):
    return TinyModule(head_combine=head_combine, key_dim=key_dim, positional="sinusoidal")


def _trainer(tmp_path, cb, max_epochs=1, **kw):
    return pl.Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1, default_root_dir=tmp_path, callbacks=[cb],
                      logger=CSVLogger(tmp_path, name="csv"), enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1, **kw)


@pytest.mark.parametrize("async_plots", [True, False])
def test_callback_logs_keys_and_writes_plots(tmp_path, async_plots):
    torch.manual_seed(0)
    cb = IdentifiabilityCallback(probe_size=12, num_plot_examples=2, seed=0, async_plots=async_plots, key_aware_examples=0)
    trainer = _trainer(tmp_path, cb)
    trainer.fit(tiny_module(), datamodule=tiny_data())

    logged = trainer.logged_metrics
    for name in ("null_dim", "stochastic_null_dim", "identifiable_frac", "stochastic_identifiable_frac", "alt_tv",
                 "effective_gap", "sigma_ratio", "entropy", "joint_null_dim", "identifiable_length"):
        assert f"val/ident/{name}" in logged, name
    for h in range(4):
        assert f"val/ident/l0_h{h}/null_dim" in logged and f"val/ident/l0_h{h}/identifiable_frac" in logged
    # Closed form on the probe (concat, d/h = 4, distinct tokens): mean over examples of max(0, n - 4).
    probe = json.loads((tmp_path / "identifiability" / "probe.json").read_text())
    assert len(probe["indices"]) == 12 and probe["lengths"] == sorted(probe["lengths"])
    expected = np.mean([max(0, n - 4) for n in probe["lengths"]])
    assert float(logged["val/ident/null_dim"]) == pytest.approx(expected)
    assert float(logged["val/ident/identifiable_frac"]) == pytest.approx(np.mean([n <= 4 for n in probe["lengths"]]))

    with open(trainer.logger.log_dir + "/metrics.csv") as f:
        header = next(csv.reader(f))
    assert "val/ident/l0_h3/alt_tv" in header

    epoch_dir = tmp_path / "identifiability" / "epoch_000"
    pngs = sorted(p.name for p in epoch_dir.glob("*.png"))
    assert "null_dim_vs_length.png" in pngs
    assert len([p for p in pngs if p.startswith("attention_val")]) == 2
    assert all((epoch_dir / p).stat().st_size > 1000 for p in pngs)
    assert json.loads((epoch_dir / "ident_metrics.json").read_text())["val/ident/null_dim"] == pytest.approx(expected)


def test_callback_skips_epochs_and_needs_a_datamodule(tmp_path):
    cb = IdentifiabilityCallback(probe_size=4, every_n_epochs=2, plots=False)
    trainer = _trainer(tmp_path, cb)
    trainer.fit(tiny_module("add"), datamodule=tiny_data())
    assert "val/ident/null_dim" not in trainer.logged_metrics
    assert not (tmp_path / "identifiability" / "epoch_000").exists()

    data = tiny_data()
    trainer = _trainer(tmp_path / "b", IdentifiabilityCallback(probe_size=4))
    with pytest.raises(RuntimeError, match="datamodule"):
        trainer.fit(tiny_module(), train_dataloaders=data.train_dataloader(), val_dataloaders=data.val_dataloader())


def test_probe_selection_is_seeded_stratified_and_capped():
    lengths = np.r_[np.full(500, 5), np.arange(6, 80)]  # most texts short, a long tail
    a = select_probe_indices(lengths, 20, seed=0, max_length=60)
    assert a == select_probe_indices(lengths, 20, seed=0, max_length=60)
    assert a != select_probe_indices(lengths, 20, seed=1, max_length=60)
    picked = lengths[a]
    assert len(set(a)) == 20 and picked.max() <= 60 and picked.min() == 5
    assert (picked > 40).sum() >= 5  # spans the range instead of following the mass at 5
    assert select_probe_indices(lengths[:3], 20) == [0, 1, 2]
    with pytest.raises(ValueError):
        IdentifiabilityCallback(probe_size=0)


def test_rendered_figures_go_to_wandb_loggers_only_with_their_epoch(tmp_path):
    from types import SimpleNamespace

    from lightning.pytorch.loggers import WandbLogger
    from PIL import Image

    class FakeRun:
        def __init__(self):
            self.calls = []

        def log(self, data, commit=None):
            self.calls.append((data, commit))

    class FakeWandb(WandbLogger):
        def __init__(self):  # no W&B run: only experiment.log is used
            self.run = FakeRun()

        @property
        def experiment(self):
            return self.run

    paths = []
    for name in ("a", "b", "c"):
        paths.append(str(tmp_path / f"{name}.png"))
        Image.new("RGB", (4, 4)).save(paths[-1])
    wb = FakeWandb()
    trainer = SimpleNamespace(loggers=[CSVLogger(tmp_path), wb])
    rendered = {"epoch": 3, "step": 7, "null_dim_vs_length": paths[:1], "attention": paths[1:], "captions": ["b", "c"]}
    IdentifiabilityCallback._log_wandb(trainer, rendered, same_row=True)
    [(data, commit)] = wb.run.calls
    assert commit is False  # held for the epoch's scalars, which Lightning logs next
    assert (data["epoch"], data["trainer/global_step"]) == (3, 7)
    assert len(data["val/ident/null_dim_vs_length"]) == 1
    assert [image._caption for image in data["val/ident/attention"]] == ["b", "c"]
    IdentifiabilityCallback._log_wandb(trainer, rendered)  # finished later in the plot thread: a row of its own
    assert wb.run.calls[1][1] is True


def test_figures_on_every_nth_and_the_last_epoch_metrics_every_epoch(tmp_path):
    cb = IdentifiabilityCallback(probe_size=6, num_plot_examples=1, plot_every_n_epochs=2, async_plots=False)
    trainer = _trainer(tmp_path, cb, max_epochs=3)
    trainer.fit(tiny_module(), datamodule=tiny_data())
    epochs = [tmp_path / "identifiability" / f"epoch_{e:03d}" for e in range(3)]
    assert [len(list(d.glob("attention_val*.png"))) for d in epochs] == [0, 1, 1]
    assert [(d / "null_dim_vs_length.png").is_file() for d in epochs] == [False, True, True]
    assert all((d / "ident_metrics.json").is_file() for d in epochs)


def _generic_key_aware(n):  # concat head, d_k = 3, d_v = 4, distinct tokens (docs/identifiability.md 2.5)
    return max(0, 3 * (n - 4) - n * (4 - 3))


@pytest.mark.parametrize("every", [1, None])
def test_key_aware_count_per_epoch_or_at_the_end_of_fit(tmp_path, every):
    torch.manual_seed(0)
    cb = IdentifiabilityCallback(probe_size=4, plots=False, key_aware_examples=3, key_aware_every_n_epochs=every)
    trainer = _trainer(tmp_path, cb, max_epochs=2)
    trainer.fit(tiny_module(key_dim=3), datamodule=tiny_data())
    folder = "epoch_001" if every else "final"
    record = json.loads((tmp_path / "identifiability" / folder / "key_aware.json").read_text())
    # targets 64 (none that long: the longest example, whole), 16 and 8 (examples cut to them)
    lengths = record["lengths"]
    assert lengths[1:] == [16, 8] and lengths[0] == max(len(x) for x in tiny_data().val_dataset["input_ids"])
    expected = np.mean([_generic_key_aware(n) for n in lengths])  # every head has the generic count
    assert record["alternative_dim"] == [[[_generic_key_aware(n)] * 4] for n in lengths]
    metrics = trainer.callback_metrics
    assert float(metrics["val/ident/key_aware_alternative_dim"]) == pytest.approx(expected)
    assert float(metrics["val/ident/key_agnostic_alternative_dim"]) == pytest.approx(np.mean([n * (n - 5) for n in lengths]))
    assert float(metrics["val/ident/key_aware_identifiable_frac"]) == 0.0
    with open(trainer.logger.log_dir + "/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = [r for r in rows if r.get("val/ident/key_aware_alternative_dim")]
    assert len(logged) == (2 if every else 1)
    assert not (tmp_path / "identifiability" / ("final" if every else "epoch_001") / "key_aware.json").exists()


def test_key_aware_examples_span_the_lengths_up_to_max_length():
    from identifiable_transformers.diagnostics.callbacks.key_aware_probe import (
        key_aware_targets,
        select_key_aware_examples,
    )

    assert key_aware_targets(3, 512) == [512, 128, 32]
    assert key_aware_targets(4, 20) == [20, 8]
    lengths = [600, 40, 130, 700, 9, 300]
    chosen = select_key_aware_examples(lengths, 3, 512, seed=0)
    assert [n for _, n in chosen] == [512, 128, 32]
    assert all(lengths[i] >= n for i, n in chosen) and len({i for i, _ in chosen}) == 3
    assert select_key_aware_examples([10, 30, 20], 2, 512) == [(1, 30), (2, 20)]  # none long enough: longest, whole
    # the report's picks (the same function): a target no unused example reaches is left out, not filled
    from identifiable_transformers.diagnostics.callbacks.key_aware_probe import pick_examples

    picked = pick_examples([10, 30, 20, 64], [64, 32, 16, 8, 8, 8])
    assert [n for _, n in picked] == [64, 16, 8, 8] and picked[0] == (3, 64)
    assert len({i for i, _ in picked}) == 4 and all([10, 30, 20, 64][i] >= n for i, n in picked)
    with pytest.raises(ValueError, match="key_aware_every_n_epochs"):
        IdentifiabilityCallback(key_aware_every_n_epochs=0)
