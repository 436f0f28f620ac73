"""Per-epoch equivalence-class ranges on the identifiability probe set (docs/diagnostics.md, "Equivalence ranges").

At the end of every ``every_n_epochs``-th validation epoch (never in the sanity check) global rank 0 computes
``equivalent_explanations`` (diagnostics/faithfulness/equivalent.py) on the probe part the faithfulness callback
scores (the IdentifiabilityCallback's probe up to ``max_length`` tokens), logs ``val/ident/range_*`` (overall, per
head of the last layer and per cumulative length bin) and writes ``<identifiability dir>/epoch_XXX/equivalence.json``
(every row's ranges). The leave-one-out reference is the faithfulness callback's, when it scored the same
examples this epoch (it runs first: conf/callbacks/default.yaml lists it before this one); else computed here.
Turn off with ``callbacks.equivalence=null``. SIGTERM stops the pass between its chunks (whole length groups:
the LPs are solved one length at a time either way): nothing is logged or written for that epoch.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from ...common.files import atomic_write
from ..faithfulness import rationale_mask
from ..faithfulness.equivalent import equivalent_explanations
from .faithfulness import FaithfulnessCallback
from .identifiability import IdentifiabilityCallback
from .probes import (
    DEFAULT_LENGTH_BINS,
    PassStopped,
    bin_key,
    bin_masks,
    check_length_bins,
    forget_metrics,
    nanmean,
    scored_part,
    sigterm_check,
    stopped_by_sigterm,
)

log = logging.getLogger(__name__)

__all__ = ["EquivalenceCallback", "range_metrics"]

PREFIX = "val/ident"
CHUNK_EXAMPLES = 8  # examples per chunk of the pass (whole length groups): where SIGTERM can stop it


def range_metrics(rep: dict[str, Any], layer: int, bins: Sequence[int] = ()) -> dict[str, float]:
    """``val/ident/range_*`` from an ``equivalent_explanations`` report (docs/diagnostics.md).

    Spreads (high - low) are averaged over the rows (examples x heads; NaN rows, e.g. examples without a
    rationale, left out); ``range_headmean/<objective>_low``/``_high`` are the head-mean explanation's least and
    greatest value (the mean over heads of the per-head bounds), averaged over examples.
    """
    out = _overall(rep, PREFIX, None)
    spread = rep["high"] - rep["low"]  # (B, H, k)
    for h in range(spread.shape[1]):
        for j, o in enumerate(rep["objectives"]):
            out[f"{PREFIX}/l{layer}_h{h}/range_{o}"] = nanmean(spread[:, h, j])
    for key, v in rep["per_example"].items():  # "best/comprehensiveness" -> range_comprehensiveness_best
        extreme, _, metric = key.partition("/")
        out[f"{PREFIX}/range_{metric}_{extreme}"] = nanmean(v)
    for b, rows in bin_masks(rep["lengths"], bins).items():
        out.update(_overall(rep, f"{PREFIX}/{bin_key(b)}", rows))
    return out


def _overall(rep: dict[str, Any], prefix: str, rows: torch.Tensor | None) -> dict[str, float]:
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])  # noqa: E731
    low, high, free = pick(rep["low"]), pick(rep["high"]), pick(rep["free_dim"])
    out = {f"{prefix}/range_free_frac": float((free > 0).double().mean())}
    for j, o in enumerate(rep["objectives"]):
        out[f"{prefix}/range_{o}"] = nanmean(high[..., j] - low[..., j])
        if o != "top":  # a per-head top token has no head-mean counterpart (mean_top is that)
            out[f"{prefix}/range_headmean/{o}_low"] = nanmean(low[..., j].mean(1))
            out[f"{prefix}/range_headmean/{o}_high"] = nanmean(high[..., j].mean(1))
    if "token_low" in rep:
        tok = pick(rep["token_high"]) - pick(rep["token_low"])  # (B, H, T), NaN at padding
        out[f"{prefix}/range_token_mean"] = nanmean(tok.nanmean(-1))  # per row over its tokens, then over rows
        out[f"{prefix}/range_token_max"] = nanmean(torch.nan_to_num(tok, nan=-math.inf).amax(-1))
    return out


class EquivalenceCallback(pl.Callback):
    """Equivalence-class ranges of the last layer's ``<cls>`` rows on the probe set, every ``every_n_epochs``.

    Args:
        every_n_epochs: run on epochs where (epoch + 1) % every_n_epochs == 0.
        max_length: the probe part scored, as the faithfulness callback's ``max_length`` (a token count or a
            length-bin symbol; None: the whole probe). The LPs grow with the length.
        length_bins: cumulative length bins the metrics are also logged in (``val/ident/len_le_B/range_*``).
        token_ranges: also every token's weight range (2 n LPs more per row; ``range_token_mean``/``_max``).
        probe_size, probe_seed, max_probe_length, output_dir: used only without an IdentifiabilityCallback.
    """

    def __init__(self, every_n_epochs: int = 1, max_length: int | str | None = "2d+2",
                 length_bins: Sequence[int | str] | None = DEFAULT_LENGTH_BINS, token_ranges: bool = False,
                 probe_size: int = 64, probe_seed: int = 0, max_probe_length: int | None = None,
                 output_dir: str | None = None) -> None:
        super().__init__()
        if every_n_epochs < 1:
            raise ValueError(f"callbacks.equivalence.every_n_epochs must be >= 1, got {every_n_epochs}")
        self.every_n_epochs, self.token_ranges = every_n_epochs, bool(token_ranges)
        self.length_bins = check_length_bins(length_bins)
        self.max_length = None if max_length is None else check_length_bins([max_length], "max_length")[0]
        self._own = IdentifiabilityCallback(probe_size=probe_size, seed=probe_seed, max_probe_length=max_probe_length,
                                            output_dir=output_dir, plots=False)
        self._scored: dict[str, Any] | None = None
        self._skip_reason: str | None = None
        self.last_report: dict[str, Any] | None = None
        self.last_metrics: dict[str, float] | None = None

    def _ident(self, trainer: pl.Trainer) -> IdentifiabilityCallback:
        return next((c for c in trainer.callbacks if isinstance(c, IdentifiabilityCallback)), self._own)

    def _probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        if self._scored is None:
            probe = self._ident(trainer)._ensure_probe(trainer, pl_module)
            self._scored = scored_part(probe, pl_module.model, self.max_length, self.length_bins, "equivalence")
        return self._scored

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if getattr(pl_module.model, "pooling", "cls") != "cls":
            self._skip_reason = f"pooling={pl_module.model.pooling!r} (the ranges need pooling=cls)"
            log.warning("equivalence ranges off: %s; set callbacks.equivalence=null to silence this", self._skip_reason)
            return
        self._probe(trainer, pl_module)

    def _loo(self, trainer: pl.Trainer, probe: dict[str, Any]) -> torch.Tensor | None:
        """The faithfulness callback's loo scores of this epoch, when it scored exactly these examples."""
        faith = next((c for c in trainer.callbacks if isinstance(c, FaithfulnessCallback)), None)
        if faith is None or faith.last_epoch != trainer.current_epoch or faith.last_report is None:
            return None
        loo = faith.last_report["scores"].get("loo")
        ok = loo is not None and faith._scored is not None and faith._scored["indices"] == probe["indices"]
        return loo if ok and loo.shape == probe["batch"]["input_ids"].shape else None

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._skip_reason or trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        probe = self._probe(trainer, pl_module)
        if not trainer.is_global_zero:
            return
        t0 = time.perf_counter()
        try:
            rep = self._ranges(pl_module, probe, self._loo(trainer, probe), sigterm_check(trainer))
        except PassStopped:
            forget_metrics(trainer, self.last_metrics)
            stopped_by_sigterm("equivalence ranges", trainer.current_epoch, t0)
            return
        metrics = range_metrics(rep, rep["layer"], probe["length_bins"])
        metrics[f"{PREFIX}/equivalence_compute_s"] = time.perf_counter() - t0  # not range_*: no spread
        for key, value in metrics.items():
            pl_module.log(key, value, on_step=False, on_epoch=True, sync_dist=False, rank_zero_only=True)
        self.last_report, self.last_metrics = rep, metrics
        out = self._ident(trainer)._out_dir(trainer) / f"epoch_{trainer.current_epoch:03d}"
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "equivalence.json", json.dumps(_record(rep, probe)))


    def _ranges(self, pl_module: pl.LightningModule, probe: dict[str, Any], loo: torch.Tensor | None,
                check) -> dict[str, Any]:
        """``equivalent_explanations`` on the probe, chunk after chunk (``check`` before each) and merged."""
        dev, batch = pl_module.device, probe["batch"]
        ids, mask = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
        rmask = None
        if probe.get("rationales") is not None:
            rmask = rationale_mask(probe["rationales"], ids.shape[1]).to(dev)
        parts = []
        for rows in length_chunks(probe["lengths"], CHUNK_EXAMPLES):
            check()
            parts.append(equivalent_explanations(
                pl_module.model, ids[rows], mask[rows], rationale_mask=None if rmask is None else rmask[rows],
                loo=None if loo is None else loo[rows].to(dev), token_ranges=self.token_ranges))
        return _concat(parts)


def length_chunks(lengths, size: int) -> list[slice]:
    """Consecutive runs of examples (sorted by length, as the probe is) of at least ``size`` examples, each made of
    whole length groups, so that every length's block LP holds the same rows as on the whole probe."""
    chunks, start = [], 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or (i - start >= size and lengths[i] != lengths[i - 1]):
            chunks.append(slice(start, i))
            start = i
    return chunks


def _concat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from the reports of consecutive chunks: per-example tensors joined, the rest (layer,
    objectives, guide) the same in every chunk."""
    first = parts[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            out[key] = torch.cat([p[key] for p in parts])
        elif isinstance(value, dict):
            out[key] = _concat([p[key] for p in parts])
        else:
            out[key] = value
    return out


def _record(rep: dict[str, Any], probe: dict[str, Any]) -> dict[str, Any]:
    """What equivalence.json holds: per example and head, each objective's [low, value, high] (null: NaN)."""
    fin = lambda x: None if math.isnan(x) else round(x, 6)  # noqa: E731
    bounds = torch.stack([rep["low"], rep["value"], rep["high"]], -1)  # (B, H, k, 3)
    return {"layer": rep["layer"], "objectives": rep["objectives"], "guide": rep["guide"],
            "indices": [int(i) for i in probe["indices"]], "lengths": [int(n) for n in probe["lengths"]],
            "free_dim": rep["free_dim"].tolist(),
            "ranges": [[[[fin(x) for x in o] for o in h] for h in ex] for ex in bounds.tolist()],
            "extremes": {k: [None if math.isnan(float(x)) else float(x) for x in v]
                         for k, v in rep["per_example"].items()}}
