"""The noise filters drop exactly their message, and the model summary has no FLOPs column of zeros."""

import logging
import warnings

import lightning.pytorch as pl
import torch

from identifiable_transformers.common.quiet import ModelSummary, silence_known_noise


def test_the_pytree_deprecation_is_dropped_and_other_future_warnings_kept():
    from lightning.pytorch.utilities._pytree import _tree_flatten

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _tree_flatten(1)  # builds torch's deprecated LeafSpec: the real message
        assert any("LeafSpec" in str(w.message) for w in seen), "precondition: Lightning still warns"
        seen.clear()
        silence_known_noise()
        _tree_flatten(1)
        warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["another FutureWarning"]


def test_wandbs_image_sizes_warning_is_dropped_and_other_warnings_kept(caplog):
    silence_known_noise()
    silence_known_noise()  # idempotent: one filter
    assert sum(type(f).__name__ == "_DropMessage" for f in logging.getLogger().filters) == 1
    with caplog.at_level(logging.WARNING):
        logging.warning("Images sizes do not match. This will causes images to be display incorrectly in the UI.")
        logging.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)


def _summary(callback, caplog):
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.callbacks.model_summary"):
        trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             callbacks=[callback])
        callback.on_fit_start(trainer, _Tiny())
    return caplog.text


def test_the_model_summary_has_no_flops_when_none_were_counted(caplog):
    assert "FLOPs" in _summary(pl.callbacks.ModelSummary(), caplog)  # Lightning's own has the column of zeros
    caplog.clear()
    text = _summary(ModelSummary(), caplog)
    assert "FLOPs" not in text and "Total Flops" not in text
    assert "layer" in text and "Linear" in text and "8         Total params" in text  # 3*2 + 2 parameters
