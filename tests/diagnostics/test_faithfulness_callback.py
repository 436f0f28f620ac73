"""FaithfulnessCallback through the real training app (tiny CPU run) and its W&B table."""

import json
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from diag_helpers import TinyData, TinyModule
from lightning.pytorch.loggers import CSVLogger

from identifiable_transformers.diagnostics.callbacks.faithfulness import FaithfulnessCallback
from identifiable_transformers.diagnostics.callbacks.identifiability import IdentifiabilityCallback
from identifiable_transformers.diagnostics.faithfulness import CHEAP_EXPLAINERS, METRICS
from identifiable_transformers.run.training import run


def test_training_logs_faithfulness_and_writes_explanations(make_cfg, tmp_path):
    cfg = make_cfg("trainer.max_epochs=2", "test=false")
    result = run(cfg)
    m = result["metrics"]
    for e in CHEAP_EXPLAINERS:
        for metric in METRICS:
            assert f"val/faith/{e}/{metric}" in m, (e, metric)
    assert m["val/faith/loo/tau_loo"] == 1.0
    assert -1.0 <= m["val/faith/uniform_acc_gap"] <= 1.0
    for key in ("integrated_gradients/comprehensiveness", "integrated_gradients/delta_abs_max", "adversarial_tv"):
        assert f"val/faith/final/{key}" in m, key
    assert 0.0 <= m["val/faith/final/adversarial_tv"] <= 1.0

    ident = tmp_path / "run" / "identifiability"
    probe = json.loads((ident / "probe.json").read_text())
    ex = json.loads((ident / "explanations.json").read_text())
    # the probe part the callback scores: examples up to its max_length (conf default 2d + 2; null: all)
    limits = {None: probe["max_probe_length"], "2d+2": 2 * cfg.model.embed_dim + 2}
    limit = limits[cfg.callbacks.faithfulness.max_length]
    scored = [(i, n) for i, n in zip(probe["indices"], probe["lengths"]) if n <= limit]
    assert list(zip(ex["indices"], ex["lengths"])) == scored and scored
    assert set(ex["scores"]) == set(CHEAP_EXPLAINERS)
    for i, n in enumerate(ex["lengths"]):
        assert len(ex["tokens"][i]) == n and ex["tokens"][i][0] == "<cls>"
        for e in CHEAP_EXPLAINERS:
            assert len(ex["scores"][e][i]) == n and ex["scores"][e][i][0] == 0.0
    per_epoch = json.loads((ident / "epoch_001" / "faith_metrics.json").read_text())
    # the logged value went through float32
    key = "val/faith/attention/comprehensiveness"
    assert per_epoch[key] == pytest.approx(m[key])
    assert (ident / "epoch_000" / "faith_metrics.json").is_file()
    final = json.loads((ident / "faithfulness_final.json").read_text())
    assert final["indices"] == ex["indices"] and len(final["ig_scores"]) == len(scored)
    assert len(final["adversarial"]["tv"]) == 2  # adversarial_examples=2 in the fast config


def test_faithfulness_can_be_turned_off(make_cfg):
    assert "faithfulness" in make_cfg().callbacks
    assert make_cfg("callbacks.faithfulness=null").callbacks.get("faithfulness") is None


def test_final_table_goes_to_wandb_loggers():
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    class FakeWandb(WandbLogger):
        def __init__(self):  # no W&B run: only log_table and log_metrics are used
            self.tables, self.metrics = [], []

        def log_table(self, key, columns=None, data=None, **kwargs):
            self.tables.append((key, columns, data))

        def log_metrics(self, metrics, step=None):
            self.metrics.append(metrics)

    wb = FakeWandb()
    final = {"indices": [4, 9], "lengths": [2, 3], "tokens": [["<cls>", "a"], ["<cls>", "b", "c"]],
             "predicted": [1, 0], "prob": [0.9, 0.6], "labels": [1, 1],
             "scores": {"loo": [[0.0, 0.5], [0.0, 0.1, 0.2]]}, "ig_scores": [[0.0, 1.0], [0.0, 2.0, 3.0]],
             "metrics": {"val/faith/loo/tau_loo": 1.0, "val/faith/final/adversarial_tv": 0.3,
                         "val/faith/final/x": None}}
    FaithfulnessCallback._log_wandb(SimpleNamespace(loggers=[CSVLogger("unused"), wb]), final)
    key, columns, data = wb.tables[0]
    assert key == "faith/explanations"
    assert columns == ["index", "length", "tokens", "predicted", "prob", "label", "loo", "integrated_gradients"]
    assert data[1][:6] == [9, 3, "<cls> b c", 0, 0.6, 1] and json.loads(data[1][6]) == [0.0, 0.1, 0.2]
    assert wb.metrics == [{"val/faith/final/adversarial_tv": 0.3}]


def test_bad_arguments_fail_fast():
    with pytest.raises(ValueError, match="explainers"):
        FaithfulnessCallback(explainers=["attn"])
    with pytest.raises(ValueError, match="every_n_epochs"):
        FaithfulnessCallback(every_n_epochs=0)


def _rows(n_rows, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_rows):
        n = int(rng.integers(2, 30))
        # every other example has a rationale: all its real tokens after <cls>
        out.append({"input_ids": [2] + rng.integers(3, 60, n - 1).tolist(), "labels": int(rng.integers(0, 2)),
                    "rationale": list(range(1, n)) if i % 2 == 0 else []})
    return out

def _fit(tmp_path, faith, progress_bar=False):
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, default_root_dir=tmp_path,
                         callbacks=[IdentifiabilityCallback(probe_size=12, plots=False), faith],
                         logger=CSVLogger(tmp_path, name="csv"), enable_checkpointing=False,
                         enable_progress_bar=progress_bar, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(TinyModule(), datamodule=TinyData(_rows(32, 0), _rows(40, 1), has_rationales=True))
    return trainer


def test_rationales_reach_the_probe_and_the_plausibility_metrics(tmp_path):
    """A data module with rationales: the probe prefers examples that have one, and every explainer gets
    rationale_auprc / rationale_f1. Known answer: a rationale of every real token (not <cls>) gives 1 for any
    explainer, so a mask shifted by one position (or one covering <cls> or padding) would show."""
    torch.manual_seed(0)
    trainer = _fit(tmp_path, FaithfulnessCallback(final=False, random_draws=3))
    probe = json.loads((tmp_path / "identifiability" / "probe.json").read_text())
    assert len(probe["indices"]) == 12 and all(i % 2 == 0 for i in probe["indices"])  # 20 have one: all chosen
    logged = trainer.logged_metrics
    for e in CHEAP_EXPLAINERS:
        assert float(logged[f"val/faith/{e}/rationale_auprc"]) == 1.0, e
        assert float(logged[f"val/faith/{e}/rationale_f1"]) == 1.0, e
    assert "val/faith/random/comprehensiveness_std" in logged
    ex = json.loads((tmp_path / "identifiability" / "explanations.json").read_text())
    assert [len(r) for r in ex["rationales"]] == [n - 1 for n in ex["lengths"]]


def test_probe_prefers_examples_with_a_rationale_and_fills_up_from_the_rest():
    import numpy as np

    from identifiable_transformers.diagnostics.callbacks.identifiability import select_probe_indices

    lengths = np.arange(100) % 30 + 2
    preferred = np.arange(100) % 10 == 0  # 10 examples have a rationale
    picked = select_probe_indices(lengths, 16, seed=0, preferred=preferred)
    assert len(set(picked)) == 16 and set(np.flatnonzero(preferred)) <= set(picked)
    assert picked == sorted(picked, key=lambda i: (lengths[i], i))
    few = select_probe_indices(lengths, 5, seed=0, preferred=preferred)
    assert all(preferred[i] for i in few)
    # every example preferred (or none given): the plain draw
    assert select_probe_indices(lengths, 16, seed=3, preferred=np.ones(100, bool)) == select_probe_indices(
        lengths, 16, seed=3)


@pytest.mark.parametrize("progress_bar", [True, False])
def test_end_of_fit_stage_shows_a_progress_bar_only_when_the_trainer_does(tmp_path, capsys, progress_bar):
    faith = FaithfulnessCallback(ig_steps=2, adversarial_examples=2, adversarial_steps=3, adversarial_restarts=1,
                                 random_draws=1)
    trainer = _fit(tmp_path, faith, progress_bar=progress_bar)
    err = capsys.readouterr().err
    assert ("Faithfulness (end of fit)" in err) == progress_bar
    if progress_bar:  # 2 units for integrated gradients, steps + 2 for the adversarial search: 7 in all
        assert "7/7" in err
    assert "val/faith/final/adversarial_tv" in trainer.callback_metrics


def test_a_synthetic_task_logs_plausibility_for_every_explainer(make_cfg, tmp_path):
    """Through train.run on data with rationales (synthetic_order): every explainer's rationale_auprc and
    rationale_f1 reach metrics.json, every probe example has a rationale, and explanations.json keeps them."""
    from identifiable_transformers.diagnostics.faithfulness import PLAUSIBILITY_METRICS

    m = run(make_cfg("data=synthetic_order", "data.max_length=32", "test=false"))["metrics"]
    for e in CHEAP_EXPLAINERS:
        for metric in PLAUSIBILITY_METRICS:
            assert 0.0 <= m[f"val/faith/{e}/{metric}"] <= 1.0, (e, metric)
    assert 0.0 <= m["val/faith/final/integrated_gradients/rationale_auprc"] <= 1.0
    assert m["val/faith/random/rationale_auprc_std"] >= 0.0
    ex = json.loads((tmp_path / "run" / "identifiability" / "explanations.json").read_text())
    assert ex["rationales"] and all(0 < min(r) and max(r) < n for r, n in zip(ex["rationales"], ex["lengths"]))
