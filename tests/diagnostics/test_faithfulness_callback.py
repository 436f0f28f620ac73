"""FaithfulnessCallback through the real training app (tiny CPU run) and its W&B table."""

import json
from types import SimpleNamespace

import pytest

from identifiable_transformers.diagnostics.faithfulness import CHEAP_EXPLAINERS, METRICS
from identifiable_transformers.diagnostics.faithfulness_callback import FaithfulnessCallback
from identifiable_transformers.training import run


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
    assert ex["indices"] == probe["indices"] and ex["lengths"] == probe["lengths"]
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
    assert final["indices"] == probe["indices"] and len(final["ig_scores"]) == len(probe["indices"])
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
