"""Per-epoch identifiability diagnostics on a fixed probe set (docs/identifiability.md section 2).

At the end of every ``every_n_epochs``-th validation epoch (never during the sanity check) the
callback runs ``attention_identifiability`` on a fixed, seeded probe set drawn from the
validation split, logs per layer/head and overall means under ``val/ident/...`` and writes
plots (PNG, and W&B images when a ``WandbLogger`` is attached). With a ``WandbLogger`` it also logs
the per-head values as a table every epoch (``val/ident/heads``) and, at the end of fit, a table of
the probe examples with their attention maps (``val/ident/probe``). The probe spans the lengths up
to the data's ``max_length``, stratified by length (probes.py), and every overall metric is also logged per
cumulative length bin (``val/ident/len_le_B/...``). Only global rank 0 computes, logs and writes files;
the maths (one batched float64 SVD per distinct length) runs on the module's device. SIGTERM stops the pass
between its chunks (probes.sigterm_check): nothing is logged or written for that epoch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from ...common.files import atomic_write
from ...common.progress import bar_on, stage
from ...tracking.wandb_logging import log_epoch_media, logged_step, wandb_loggers
from ..maths import attention_identifiability, identifiable_length
from ..maths.internals import merge_reports
from ..maths.key_aware_heads import key_aware_unsupported
from .media import IdentifiabilityMedia, _render, attention_image  # noqa: F401 (re-exported)
from .probes import (
    DEFAULT_LENGTH_BINS,
    PassStopped,
    check_length_bins,
    doubling_strata,
    forget_metrics,
    resolve_length_bins,
    select_probe_indices,
    sigterm_check,
    sigterm_noted,
    stopped_by_sigterm,
)
from .summaries import _PER_HEAD_KEY, HEAD_COLUMNS, head_rows, summarize_report  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

__all__ = ["IdentifiabilityCallback", "select_probe_indices", "summarize_report"]

class IdentifiabilityCallback(IdentifiabilityMedia, pl.Callback):
    """Log identifiability diagnostics of the attention heads once per validation epoch.

    Args:
        probe_size: number of validation examples in the fixed probe set.
        every_n_epochs: run on epochs where (epoch + 1) % every_n_epochs == 0.
        seed: seed of the probe selection (the same seed gives the same probes for every model
            trained on the same data, so concat and add runs are compared on identical inputs).
        num_plot_examples: probe sentences drawn as attention heatmaps each epoch (0: none).
        max_probe_length: longest eligible example; None = the data's ``max_length`` (else the model's
            ``max_len``), so the probe spans every length the model sees.
        probe_strata: upper ends of the length intervals the probe is stratified over (each gets an equal
            share); None = doubling ones, 8, 16, 32, ... up to the longest eligible length; [] = one interval
            (targets evenly spaced over the whole range). The strata depend on the data only, never on
            the model, so both designs get the same probes.
        length_bins: cumulative length bins the overall metrics are also logged in, as
            ``val/ident/len_le_B/<metric>`` (with ``probe_count``): token counts or the symbols "dv+1"
            (min(d_v, d) + 1), "2d+2", "max/2" and "max" (of the longest eligible length); a bin above it
            becomes it; [] or None: none.
        device: where the identifiability maths runs (float64); None = the module's device (the CPU for
            MPS, which has no float64). The attention itself always runs on the module's device.
        output_dir: where probe ids, PNGs and metric JSONs go; None =
            ``<trainer.default_root_dir>/identifiability``.
        plots: write the figures (False: metrics only).
        plot_every_n_epochs: draw the figures on every n-th diagnosed epoch and the last one (the
            metrics are logged every time). Drawing is most of the callback's cost: on 2 CPU cores
            a heatmap figure takes about 0.5 s, next to an epoch of about 5 s on the default run.
        async_plots: draw the figures in a background thread so training continues meanwhile;
            None (default) = only when the model trains on an accelerator. On a CPU-only machine
            the thread competes with training for the same cores and makes the epoch slower.
            Finished figures go to W&B at the next epoch end and all are flushed at the end of fit.
        per_head_scalars: log ``val/ident/l{l}_h{h}/<metric>`` scalars (False: only the overall and
            per-layer means; the per-head values are still in ``ident_metrics.json`` and, with W&B,
            in the ``val/ident/heads`` table).
        wandb_tables: with a ``WandbLogger``, log the ``val/ident/heads`` table every diagnosed
            epoch and the ``val/ident/probe`` table (every probe example, layer and head, with its
            attention map) at the end of fit.
        key_aware_examples: validation examples for the key-aware count (docs/identifiability.md
            2.5), with lengths max_length, max_length / 4, max_length / 16, ... (0: off).
        key_aware_every_n_epochs: count on every n-th diagnosed epoch; None = once, at the end of
            fit (for long inputs, where one count costs seconds per head).
        key_aware_max_length: the longest probe; None = the data's ``max_length`` (else the model's).
        chunk_size: probe examples analysed at a time, grouped by length (the logged numbers are the same for
            every value); None = the whole probe at once. At 512 tokens the whole default probe of a
            MiniLM-sized encoder holds gigabytes of float64 maps (docs/performance.md).
    """

    def __init__(
        self,
        probe_size: int = 64,
        every_n_epochs: int = 1,
        seed: int = 0,
        num_plot_examples: int = 2,
        max_probe_length: int | None = None,
        output_dir: str | None = None,
        plots: bool = True,
        plot_every_n_epochs: int = 10,
        async_plots: bool | None = None,
        per_head_scalars: bool = True,
        wandb_tables: bool = True,
        key_aware_examples: int = 3,
        key_aware_every_n_epochs: int | None = 1,
        key_aware_max_length: int | None = None,
        probe_strata: Sequence[int] | None = None,
        length_bins: Sequence[int | str] | None = DEFAULT_LENGTH_BINS,
        device: str | None = None,
        chunk_size: int | None = 2,
    ) -> None:
        super().__init__()
        if probe_size < 1:
            raise ValueError(f"probe_size must be >= 1, got {probe_size}")
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or null (the whole probe at once), got {chunk_size}")
        if plot_every_n_epochs < 1:
            raise ValueError(f"plot_every_n_epochs must be >= 1, got {plot_every_n_epochs}")
        if num_plot_examples < 0:
            raise ValueError(f"num_plot_examples must be >= 0, got {num_plot_examples}")
        if max_probe_length is not None and max_probe_length < 1:
            raise ValueError(f"max_probe_length must be >= 1 or null, got {max_probe_length}")
        if key_aware_examples < 0:
            raise ValueError(f"key_aware_examples must be >= 0, got {key_aware_examples}")
        if key_aware_every_n_epochs is not None and key_aware_every_n_epochs < 1:
            raise ValueError("key_aware_every_n_epochs must be >= 1 or null (end of fit), "
                             f"got {key_aware_every_n_epochs}")
        if key_aware_max_length is not None and key_aware_max_length < 2:
            raise ValueError(f"key_aware_max_length must be >= 2 or null, got {key_aware_max_length}")
        if probe_strata is not None and any(int(e) < 1 for e in probe_strata):
            raise ValueError(f"probe_strata must be token counts >= 1 (or null: doubling), got {list(probe_strata)}")
        self.length_bins = check_length_bins(length_bins)
        self.probe_strata = None if probe_strata is None else [int(e) for e in probe_strata]
        self.device, self.chunk_size = device, chunk_size
        self.key_aware_examples, self.key_aware_every_n_epochs = key_aware_examples, key_aware_every_n_epochs
        self.key_aware_max_length = key_aware_max_length
        self._key_aware_probe: dict[str, Any] | None = None
        self._key_aware_skipped = False
        self.probe_size, self.every_n_epochs, self.seed = probe_size, every_n_epochs, seed
        self.num_plot_examples, self.max_probe_length = num_plot_examples, max_probe_length
        self.output_dir = output_dir
        self.plots, self.async_plots = plots, async_plots
        self.plot_every_n_epochs = plot_every_n_epochs
        self.per_head_scalars, self.wandb_tables = per_head_scalars, wandb_tables
        self._head_rows: list[list] = []
        self._last_epoch = 0
        self._executor = None
        self._pending: list = []
        self._probe: dict[str, Any] | None = None
        self.last_report: dict[str, Any] | None = None
        self.last_metrics: dict[str, float] | None = None

    # -------------------------------------------------------------------------------- probe set
    def _out_dir(self, trainer: pl.Trainer) -> Path:
        return Path(self.output_dir) if self.output_dir else Path(trainer.default_root_dir) / "identifiability"

    def _build_probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        dm = getattr(trainer, "datamodule", None)
        if dm is None:
            raise RuntimeError(
                "IdentifiabilityCallback needs trainer.datamodule (with val_dataset, collate and tokenizer): "
                "pass datamodule= to trainer.fit/validate, or remove the callback (callbacks.identifiability=null)"
            )
        ds = getattr(dm, "val_dataset", None)
        if ds is None or not hasattr(dm, "collate"):
            raise RuntimeError(
                "IdentifiabilityCallback needs trainer.datamodule.val_dataset and .collate; "
                f"got {type(dm).__name__} with val_dataset={type(ds).__name__}"
            )
        model = pl_module.model
        cap = min(self.max_probe_length or getattr(dm, "max_length", None) or model.max_len, model.max_len)
        lengths = np.array([len(x) for x in ds["input_ids"]])
        # docs/faithfulness.md, plausibility: with rationales, the probe prefers examples that have one.
        rationales = ds["rationale"] if getattr(dm, "has_rationales", False) else None
        preferred = None if rationales is None else [len(r) > 0 for r in rationales]
        strata = doubling_strata(cap) if self.probe_strata is None else self.probe_strata
        idx = select_probe_indices(lengths, self.probe_size, self.seed, cap, preferred=preferred, strata=strata)
        if not idx:
            raise ValueError(f"no validation example has 1 <= length <= max_probe_length={cap}: pass a larger "
                             "callbacks.identifiability.max_probe_length, or null for the data's max_length")
        too_long = int((lengths > cap).sum())
        if too_long:
            log.info("identifiability probe: %d of %d validation examples are longer than %d tokens and not eligible",
                     too_long, len(lengths), cap)
        rows = [ds[i] for i in idx]
        batch = dm.collate(rows)
        tokenizer = getattr(dm, "tokenizer", None)
        tokens = None
        if tokenizer is not None:
            tokens = [[tokenizer.id_to_token(int(t)) or str(int(t)) for t in r["input_ids"]] for r in rows]
        bounds = identifiable_length(model.head_combine, model.embed_dim, model.num_heads, model.value_dim)
        bins = resolve_length_bins(self.length_bins, embed_dim=model.embed_dim,
                                   head_stochastic=bounds["head_stochastic"], max_length=cap)
        probe = {"indices": idx, "lengths": [int(lengths[i]) for i in idx], "batch": batch, "tokens": tokens,
                 "bounds": bounds, "max_probe_length": cap, "strata": [int(e) for e in strata],
                 "length_bins": bins}
        if rationales is not None:
            probe["rationales"] = [[int(j) for j in rationales[i]] for i in idx]
        if trainer.is_global_zero:
            out = self._out_dir(trainer)
            out.mkdir(parents=True, exist_ok=True)
            meta = {k: probe[k] for k in ("indices", "lengths", "bounds", "max_probe_length", "strata", "length_bins")}
            meta.update(seed=self.seed, probe_size=self.probe_size, split="validation",
                        num_validation_examples=len(lengths), num_too_long=too_long)
            atomic_write(out / "probe.json", json.dumps(meta, indent=1))
        n = np.array(probe["lengths"])
        log.info("identifiability probe: %d examples, lengths %d-%d, %d above the head bound %d; per length bin %s",
                 len(idx), n.min(), n.max(), int((n > bounds["head"]).sum()), bounds["head"],
                 ", ".join(f"<= {b}: {int((n <= b).sum())}" for b in bins))
        return probe

    def maths_device(self, pl_module: pl.LightningModule) -> torch.device:
        """Where the float64 maths runs: ``device``, else the module's (the CPU for MPS: no float64 there)."""
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cpu") if pl_module.device.type == "mps" else pl_module.device

    def _ensure_probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        if self._probe is None:
            self._probe = self._build_probe(trainer, pl_module)
        return self._probe

    # ------------------------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Fail at the start of training, not after the first epoch, when the data is unusable.
        self._ensure_probe(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        probe = self._ensure_probe(trainer, pl_module)
        if not trainer.is_global_zero:
            return
        t0 = time.perf_counter()
        try:
            with stage(f"Identifiability diagnostics (epoch {trainer.current_epoch})", bar=bar_on(trainer)):
                self._epoch_diagnostics(trainer, pl_module, probe, sigterm_check(trainer))
        except PassStopped:
            forget_metrics(trainer, self.last_metrics)
            stopped_by_sigterm("identifiability diagnostics", trainer.current_epoch, t0)

    def _identifiability(self, pl_module: pl.LightningModule, batch: dict[str, Any], check) -> dict[str, Any]:
        """``attention_identifiability`` on the probe, ``check`` before each chunk: the chunks of its own
        ``chunk_size`` (grouped by length, in the same order, the model at the probe's width), so the same report."""
        model, device = pl_module.model, self.maths_device(pl_module)
        ids, mask = batch["input_ids"].to(pl_module.device), batch["attention_mask"].to(pl_module.device)
        if self.chunk_size is None:
            check()
            return attention_identifiability(model, ids, mask, device=device)
        order = torch.argsort(mask.bool().sum(-1).cpu(), stable=True)
        parts = []
        for lo in range(0, len(order), self.chunk_size):
            check()
            idx = order[lo : lo + self.chunk_size]
            rows = idx.to(ids.device)
            parts.append((idx, attention_identifiability(model, ids[rows], mask[rows], device=device)))
        return merge_reports(parts, len(order))

    def _epoch_diagnostics(self, trainer: pl.Trainer, pl_module: pl.LightningModule, probe: dict[str, Any],
                           check=lambda: None) -> None:
        """Compute, log and write one epoch's diagnostics; ``check`` (probes.sigterm_check) runs between chunks and
        stops the pass with PassStopped before anything is logged."""
        t0 = time.perf_counter()
        report = self._identifiability(pl_module, probe["batch"], check)
        metrics = summarize_report(report, bins=probe["length_bins"])
        bounds = probe["bounds"]
        metrics["val/ident/identifiable_length"] = float(bounds["head"])
        metrics["val/ident/joint_identifiable_length"] = float(bounds["joint"])
        metrics["val/ident/compute_s"] = time.perf_counter() - t0
        epoch = trainer.current_epoch
        every = self.key_aware_every_n_epochs
        if self.key_aware_examples and every and (epoch + 1) % every == 0:
            metrics.update(self._key_aware(trainer, pl_module, f"epoch_{epoch:03d}", check))
        for key, value in metrics.items():
            if self.per_head_scalars or not _PER_HEAD_KEY.match(key):
                pl_module.log(key, value, on_step=False, on_epoch=True, sync_dist=False, rank_zero_only=True)
        self.last_report, self.last_metrics, self._last_epoch = report, metrics, epoch
        out = self._out_dir(trainer) / f"epoch_{epoch:03d}"
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "ident_metrics.json", json.dumps(metrics, indent=1))
        if self.wandb_tables and wandb_loggers(trainer):
            import wandb

            self._head_rows += head_rows(report, epoch)  # all epochs so far: the newest table shows the history
            log_epoch_media(trainer, {"val/ident/heads": wandb.Table(columns=HEAD_COLUMNS, data=self._head_rows)},
                            epoch, logged_step(trainer), same_row=True)
        if self._plots_now(trainer) and not sigterm_noted(trainer):  # the numbers are kept; figures can wait
            self._plot(trainer, pl_module, report, probe, out)

    # ------------------------------------------------------------------------------- key-aware
    def _key_aware(self, trainer: pl.Trainer, pl_module: pl.LightningModule, folder: str,
                   check=None) -> dict[str, float]:
        """The key-aware count on the long probe sentences (``check`` before each); writes
        ``<folder>/key_aware.json``."""
        from .key_aware_probe import key_aware_batch, key_aware_metrics, select_key_aware_examples

        reason = key_aware_unsupported(pl_module.model)
        if reason is not None:  # DeBERTa, ModernBERT (docs/pretrained.md): said once, not an error mid-fit
            if not self._key_aware_skipped:
                log.warning("key-aware count skipped: %s, so its maps are not softmax(s Q K^T) of the projections",
                            reason)
                self._key_aware_skipped = True
            return {}
        if self._key_aware_probe is None:
            dm, model = trainer.datamodule, pl_module.model
            cap = min(self.key_aware_max_length or getattr(dm, "max_length", None) or model.max_len, model.max_len)
            ds = dm.val_dataset
            lengths = [len(x) for x in ds["input_ids"]]
            chosen = select_key_aware_examples(lengths, self.key_aware_examples, cap, self.seed)
            batch = key_aware_batch([ds[i] for i, _ in chosen], [n for _, n in chosen], model.pad_id)
            self._key_aware_probe = {"indices": [i for i, _ in chosen], "batch": batch, "max_length": cap}
        probe = self._key_aware_probe
        metrics, record = key_aware_metrics(pl_module.model, probe["batch"], pl_module.device, check=check)
        out = self._out_dir(trainer) / folder
        out.mkdir(parents=True, exist_ok=True)
        record.update(indices=probe["indices"], max_length=probe["max_length"], metrics=metrics)
        atomic_write(out / "key_aware.json", json.dumps(record))
        return metrics

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # SIGTERM noted where Lightning's loops no longer stop (on_train_end): the run stops after this hook
        final_count = self.key_aware_examples and self.key_aware_every_n_epochs is None
        if final_count and trainer.is_global_zero and not sigterm_noted(trainer):
            # once, with the final weights: no epoch is being logged any more, so go to the loggers directly
            metrics = self._key_aware(trainer, pl_module, "final")
            trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        self._flush(trainer, wait=True)
        if (self.wandb_tables and self.last_report is not None and trainer.is_global_zero
                and not sigterm_noted(trainer) and wandb_loggers(trainer)):
            self._log_probe_table(trainer, pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.training:  # trainer.validate(): nothing runs after, so finish now
            self._flush(trainer, wait=True)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._flush(trainer, wait=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
