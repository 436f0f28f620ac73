"""Per-epoch faithfulness of token explanations on the identifiability probe set (docs/faithfulness.md).

At the end of every ``every_n_epochs``-th validation epoch (never in the sanity check) global rank 0
scores the cheap explainers on the same fixed probe set as the ``IdentifiabilityCallback`` (its probe
when that callback is attached, else one drawn with the same ``select_probe_indices`` logic and
settings), logs ``val/faith/<explainer>/<metric>`` (with ``rationale_auprc`` and ``rationale_f1`` when the data has
rationales; the random control's ``<metric>_std`` over its draws) and ``val/faith/uniform_acc_gap``, each also per
cumulative length bin (``val/faith/<explainer>/len_le_B/<metric>``, ``val/faith/len_le_B/uniform_acc_gap``), and
writes ``<identifiability dir>/epoch_XXX/faith_metrics.json``. ``max_length`` scores only the probe's examples up to
a length (the explainers' erasure copies grow with the square of the length). At the end of fit it writes
``explanations.json`` (the last epoch's scores), runs the expensive tier (integrated gradients,
adversarial attention) and writes ``faithfulness_final.json``; with a ``WandbLogger`` attached it
also logs a ``wandb.Table`` of the probe explanations and the end-of-fit metrics.

SIGTERM stops the per-epoch pass at its next explainer or erasure window (probes.sigterm_check, as the report's
``say``): nothing is logged or written for that epoch. Its epoch is kept in the checkpoint, so that a resume with
nothing left to train still finishes the end-of-fit tier; a SIGTERM noted before ``on_fit_end`` skips that tier.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from ...common.files import atomic_write
from ...common.progress import bar_on, stage
from ...tracking.wandb_logging import wandb_loggers
from ..faithfulness import (
    CHEAP_EXPLAINERS,
    EXPLAINERS,
    RANDOM_DRAWS,
    adversarial_attention,
    context_mixing_name,
    faithfulness_report,
    integrated_gradients,
    rationale_mask,
    uniform_attention_logits,
    unknown_explainers,
)
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
    sigterm_noted,
    stopped_by_sigterm,
)

log = logging.getLogger(__name__)

__all__ = ["FaithfulnessCallback"]

PREFIX = "val/faith"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class FaithfulnessCallback(pl.Callback):
    """Faithfulness metrics of token explainers, every epoch on the probe set, expensive ones at the end of fit.

    Args:
        explainers: the per-epoch explainers (default: every cheap one, i.e. all but integrated_gradients).
        every_n_epochs: run on epochs where (epoch + 1) % every_n_epochs == 0.
        seed: seed of the ``random`` explainer and of the adversarial search's starts.
        random_draws: draws of the random control averaged each epoch (their spread is logged as ``_std``).
        probe_size, probe_seed, max_probe_length, output_dir: used only without an IdentifiabilityCallback
            (then they mean what they mean there); with one attached its probe and output dir are used.
        max_length: score only the probe examples of at most this many tokens: a token count or a length
            bin symbol ("dv+1", "2d+2", "max/2", "max"); None = the whole probe. Every tier (per epoch, end of
            fit, explanations.json) uses that part of the probe.
        length_bins: cumulative length bins the per-epoch metrics are also logged in (as in the
            IdentifiabilityCallback; bins above ``max_length`` are dropped); [] or None: none.
        final: run the expensive tier at the end of fit (integrated gradients on the whole probe,
            adversarial attention on ``adversarial_examples`` probe examples spread over the lengths).
        ig_steps: integrated-gradients interpolation steps.
        adversarial_examples, adversarial_steps, adversarial_restarts, adversarial_eps: the adversarial search.
    """

    def __init__(
        self,
        explainers: Sequence[str] = CHEAP_EXPLAINERS,
        every_n_epochs: int = 1,
        seed: int = 0,
        probe_size: int = 64,
        probe_seed: int = 0,
        max_probe_length: int | None = None,
        output_dir: str | None = None,
        final: bool = True,
        ig_steps: int = 32,
        adversarial_examples: int = 8,
        adversarial_steps: int = 300,
        adversarial_restarts: int = 4,
        adversarial_eps: float = 0.01,
        random_draws: int = RANDOM_DRAWS,
        max_length: int | str | None = None,
        length_bins: Sequence[int | str] | None = DEFAULT_LENGTH_BINS,
    ) -> None:
        super().__init__()
        explainers = list(explainers)
        unknown = unknown_explainers(explainers)
        if unknown or not explainers:
            raise ValueError(f"explainers must be a non-empty subset of {list(EXPLAINERS)} (or <map>_layer<k>, e.g. "
                             f"alti_layer0); got unknown {unknown}")
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        if random_draws < 1:
            raise ValueError(f"random_draws must be >= 1, got {random_draws}")
        if adversarial_examples < 0 or adversarial_steps < 0 or adversarial_restarts < 1 or adversarial_eps <= 0:
            raise ValueError("adversarial_examples and adversarial_steps must be >= 0, adversarial_restarts >= 1 "
                             "and adversarial_eps > 0")
        self.length_bins = check_length_bins(length_bins)
        self.max_length = None if max_length is None else check_length_bins([max_length], "max_length")[0]
        self.explainers, self.every_n_epochs, self.seed, self.final = explainers, every_n_epochs, seed, final
        self.ig_steps, self.random_draws = ig_steps, random_draws
        self.adversarial = dict(examples=adversarial_examples, steps=adversarial_steps,
                                restarts=adversarial_restarts, eps=adversarial_eps)
        # Used when no IdentifiabilityCallback is attached: the same probe logic, no plots.
        self._own = IdentifiabilityCallback(probe_size=probe_size, seed=probe_seed, max_probe_length=max_probe_length,
                                            output_dir=output_dir, plots=False)
        self.last_report: dict[str, Any] | None = None
        self.last_metrics: dict[str, float] | None = None
        self.last_epoch: int | None = None
        self.stopped_epoch: int | None = None  # the last epoch whose pass SIGTERM stopped
        self.final_metrics: dict[str, float] | None = None
        self._scored: dict[str, Any] | None = None

    # -------------------------------------------------------------------------------- probe set
    def _ident(self, trainer: pl.Trainer) -> IdentifiabilityCallback:
        return next((c for c in trainer.callbacks if isinstance(c, IdentifiabilityCallback)), self._own)

    def _probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """The part of the shared probe this callback scores (examples up to ``max_length``), with its bins."""
        if self._scored is None:
            self._drop_unsupported(pl_module.model)
            probe = self._ident(trainer)._ensure_probe(trainer, pl_module)
            self._scored = scored_part(probe, pl_module.model, self.max_length, self.length_bins, "faithfulness")
        return self._scored

    def _drop_unsupported(self, model) -> None:
        """Leave out the context-mixing explainers, with a warning, where the model says they cannot read its
        layers (a DeBERTa-v2 with a convolution: hf/blocks.py), rather than fail after the first epoch."""
        reason = getattr(model, "context_mixing_unsupported", lambda: None)()
        mixing = [e for e in self.explainers if context_mixing_name(e) is not None]
        if reason is None or not mixing:
            return
        self.explainers = [e for e in self.explainers if e not in mixing]
        if not self.explainers:
            raise ValueError(f"callbacks.faithfulness.explainers={mixing}: {reason}; pick others")
        log.warning("faithfulness: leaving out %s: %s", mixing, reason)

    def _out_dir(self, trainer: pl.Trainer) -> Path:
        return self._ident(trainer)._out_dir(trainer)

    @staticmethod
    def _rationale_mask(probe: dict[str, Any]):
        """(B, T) bool mask of the probe's rationale tokens, or None when the data has no rationales."""
        if probe.get("rationales") is None:
            return None
        return rationale_mask(probe["rationales"], probe["batch"]["input_ids"].shape[1])

    # ------------------------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._probe(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        # which epoch was scored last, and which one's pass SIGTERM stopped (in last.ckpt, for a resume)
        return {"last_epoch": self.last_epoch, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resumed_epoch = state.get("last_epoch")
        self._resumed_stopped = state.get("stopped_epoch")

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        probe = self._probe(trainer, pl_module)
        if not trainer.is_global_zero:
            return
        t0 = time.perf_counter()
        try:
            with stage(f"Faithfulness diagnostics (epoch {trainer.current_epoch})", bar=bar_on(trainer)):
                report, metrics = self._score(pl_module, probe, sigterm_check(trainer))
        except PassStopped:
            forget_metrics(trainer, self.last_metrics)
            self.stopped_epoch = trainer.current_epoch
            stopped_by_sigterm("faithfulness diagnostics", trainer.current_epoch, t0)
            return
        for key, value in metrics.items():
            pl_module.log(key, value, on_step=False, on_epoch=True, sync_dist=False, rank_zero_only=True)
        self.last_report, self.last_metrics, self.last_epoch = report, metrics, trainer.current_epoch
        out = self._out_dir(trainer) / f"epoch_{trainer.current_epoch:03d}"
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "faith_metrics.json", json.dumps({k: _finite(v) for k, v in metrics.items()}, indent=1))

    def _score(self, pl_module: pl.LightningModule, probe: dict[str, Any], check=None
               ) -> tuple[dict[str, Any], dict[str, float]]:
        """The cheap explainers' report on the probe and its ``val/faith/*`` metrics. ``check``
        (probes.sigterm_check): run before the report, as its ``say`` (each explainer and erasure window) and before
        the uniform-attention gap; it stops the pass by raising."""
        t0 = time.perf_counter()
        batch = probe["batch"]
        dev = pl_module.device
        rationales = self._rationale_mask(probe)
        ids, mask = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
        if check is not None:
            check()
        # labels=None: the uniform-attention gap is computed here, per example, so that it splits into length bins
        report = faithfulness_report(pl_module.model, ids, mask, None, explainers=self.explainers, seed=self.seed,
                                     rationale_mask=None if rationales is None else rationales.to(dev),
                                     random_draws=self.random_draws, say=check)
        metrics = {f"{PREFIX}/{k}": v for k, v in report["metrics"].items()}
        labels = batch.get("labels")
        if labels is not None:
            if check is not None:
                check()
            labels = labels.to(dev)
            uniform = uniform_attention_logits(pl_module.model, ids, mask).argmax(-1)
            report["per_example"]["uniform_acc_gap"] = ((report["predicted"] == labels).double()
                                                        - (uniform == labels).double())
            report["uniform_acc_gap"] = float(report["per_example"]["uniform_acc_gap"].mean())
        metrics[f"{PREFIX}/uniform_acc_gap"] = report["uniform_acc_gap"]
        metrics.update(binned_metrics(report["per_example"], probe["lengths"], probe["length_bins"]))
        metrics[f"{PREFIX}/compute_s"] = time.perf_counter() - t0
        return report, metrics

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        if sigterm_noted(trainer):  # noted in on_train_end, where Lightning's loops no longer stop: the run stops
            log.warning("faithfulness: end-of-fit stage skipped (SIGTERM received); the resumed run does it")
            return
        resumed = (getattr(self, "_resumed_epoch", None), getattr(self, "_resumed_stopped", None))
        if self.last_report is None and trainer.current_epoch - 1 in [e for e in resumed if e is not None]:
            # A resume with nothing left to train (the run stopped in this stage, or after it, or SIGTERM stopped
            # the last validation's pass): that validation scored, or would have scored, these same final weights;
            # score them now so that the end-of-fit stage is finished.
            log.info("faithfulness: finishing the end-of-fit stage of the resumed run (epoch %d)",
                     trainer.current_epoch - 1)
            self.last_report, self.last_metrics = self._score(pl_module, self._probe(trainer, pl_module))
            self.last_epoch = trainer.current_epoch - 1
        if self.last_report is None:
            return
        probe = self._probe(trainer, pl_module)
        out = self._out_dir(trainer)
        out.mkdir(parents=True, exist_ok=True)
        explanations = self._explanations(probe, self.last_report)
        atomic_write(out / "explanations.json", json.dumps(explanations))
        final_metrics = {k: _finite(v) for k, v in (self.last_metrics or {}).items()}
        examples_extra: dict[str, Any] = {}
        if self.final:
            t0 = time.perf_counter()
            shown = bar_on(trainer)  # its own bar, with a unit per part; else the stage's lines
            with contextlib.nullcontext() if shown else stage("Faithfulness (end of fit)"):
                extra, examples_extra = self._expensive(pl_module, probe, show_progress=shown)
            final_metrics.update(extra)
            final_metrics[f"{PREFIX}/final/compute_s"] = time.perf_counter() - t0
        self.final_metrics = final_metrics
        # Lightning does not allow self.log in on_fit_end: put the end-of-fit values where training.py
        # reads the fit's metrics (trainer.callback_metrics -> metrics.json).
        for k, v in final_metrics.items():
            if k.startswith(f"{PREFIX}/final/") and v is not None:
                trainer.callback_metrics[k] = torch.tensor(float(v))
        final = {"epoch": self.last_epoch, "metrics": final_metrics, **explanations, **examples_extra,
                 "labels": [int(x) for x in probe["batch"]["labels"]],
                 "prob": [float(x) for x in self.last_report["prob"]]}
        atomic_write(out / "faithfulness_final.json", json.dumps(final))
        self._log_wandb(trainer, final)
        log.info("faithfulness: wrote %s and %s", out / "explanations.json", out / "faithfulness_final.json")

    # ------------------------------------------------------------------------------------ parts
    @staticmethod
    def _explanations(probe: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
        lengths = [int(n) for n in probe["lengths"]]
        ids = probe["batch"]["input_ids"]
        tokens = probe["tokens"] or [[str(int(t)) for t in row] for row in ids]
        extra = {"rationales": probe["rationales"]} if probe.get("rationales") is not None else {}
        return {
            **extra,
            "indices": [int(i) for i in probe["indices"]],
            "lengths": lengths,
            "tokens": [list(tokens[i][:n]) for i, n in enumerate(lengths)],
            "predicted": [int(p) for p in report["predicted"]],
            "scores": {e: [s[i, :n].tolist() for i, n in enumerate(lengths)] for e, s in
                       ((e, s.detach().cpu()) for e, s in report["scores"].items())},
        }

    def _expensive(self, pl_module: pl.LightningModule, probe: dict[str, Any], show_progress: bool = False
                   ) -> tuple[dict, dict]:
        """Integrated gradients (scores, metrics, convergence delta) and adversarial attention.

        This takes minutes on long probes, after the training bar has closed: a progress bar shows it
        (only when the trainer shows one): one unit for integrated gradients, one for its metrics, then
        the adversarial search's ``steps + 2``.
        """
        from tqdm.auto import tqdm

        model, dev = pl_module.model, pl_module.device
        k = min(self.adversarial["examples"], len(probe["lengths"]))
        total = 2 + (self.adversarial["steps"] + 2 if k else 0)
        with tqdm(total=total, desc="Faithfulness (end of fit)", disable=not show_progress, leave=True,
                  dynamic_ncols=True) as bar:
            return self._expensive_parts(model, dev, probe, bar)

    def _expensive_parts(self, model, dev, probe: dict[str, Any], bar) -> tuple[dict, dict]:
        batch = probe["batch"]
        ids, mask = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
        metrics: dict[str, float | None] = {}
        examples: dict[str, Any] = {}
        lengths = [int(n) for n in probe["lengths"]]
        bar.set_postfix_str("integrated gradients")
        ig, delta = integrated_gradients(model, ids, mask, n_steps=self.ig_steps)
        bar.update(1)
        rationales = self._rationale_mask(probe)
        rep = faithfulness_report(model, ids, mask, explainers=["integrated_gradients"], seed=self.seed,
                                  precomputed={"integrated_gradients": ig},
                                  rationale_mask=None if rationales is None else rationales.to(dev))
        bar.update(1)
        for k, v in rep["metrics"].items():
            metrics[f"{PREFIX}/final/{k}"] = _finite(v)
        metrics[f"{PREFIX}/final/integrated_gradients/delta_abs_max"] = float(delta.abs().max())
        ig = ig.detach().cpu()
        examples["ig_scores"] = [ig[i, :n].tolist() for i, n in enumerate(lengths)]
        k = min(self.adversarial["examples"], len(lengths))
        if k:
            pos = sorted({int(round(q)) for q in np.linspace(0, len(lengths) - 1, k)})
            sel = torch.tensor(pos, device=dev)
            bar.set_postfix_str("adversarial attention")
            tv = adversarial_attention(model, ids[sel], mask[sel], eps=self.adversarial["eps"],
                                       steps=self.adversarial["steps"], restarts=self.adversarial["restarts"],
                                       seed=self.seed, progress=bar.update).cpu()  # (k, H)
            metrics[f"{PREFIX}/final/adversarial_tv"] = float(tv.mean())
            metrics[f"{PREFIX}/final/adversarial_tv_max"] = float(tv.max())
            for h in range(tv.shape[1]):
                metrics[f"{PREFIX}/final/adversarial_tv/h{h}"] = float(tv[:, h].mean())
            examples["adversarial"] = {"positions": pos, "indices": [int(probe["indices"][p]) for p in pos],
                                       "eps": self.adversarial["eps"], "tv": tv.tolist()}
        return metrics, examples

    @staticmethod
    def _log_wandb(trainer: pl.Trainer, final: dict[str, Any]) -> None:
        loggers = wandb_loggers(trainer)
        if not loggers:
            return
        names = list(final["scores"])
        columns = ["index", "length", "tokens", "predicted", "prob", "label", *names]
        if "ig_scores" in final:
            columns.append("integrated_gradients")
        rows = []
        for i, idx in enumerate(final["indices"]):
            row = [idx, final["lengths"][i], " ".join(final["tokens"][i]), final["predicted"][i],
                   final["prob"][i], final["labels"][i]]
            row += [json.dumps([round(x, 5) for x in final["scores"][e][i]]) for e in names]
            if "ig_scores" in final:
                row.append(json.dumps([round(x, 5) for x in final["ig_scores"][i]]))
            rows.append(row)
        # The last epoch's values are logged already; add the end-of-fit ones.
        metrics = {k: v for k, v in final["metrics"].items() if v is not None and k.startswith(f"{PREFIX}/final/")}
        for lg in loggers:
            lg.log_table(key="faith/explanations", columns=columns, data=rows)
            if metrics:
                lg.log_metrics(metrics)


def binned_metrics(per_example: dict[str, torch.Tensor], lengths, bins: Sequence[int]) -> dict[str, float]:
    """Per cumulative length bin B: the mean (NaN-skipping, as the overall means) of every per-example metric
    over the examples of at most B tokens: ``val/faith/<explainer>/len_le_B/<metric>``, and
    ``val/faith/len_le_B/uniform_acc_gap`` and ``.../probe_count``."""
    out: dict[str, float] = {}
    for b, rows in bin_masks(lengths, bins).items():
        for key, values in per_example.items():
            explainer, _, metric = key.rpartition("/")
            name = f"{explainer}/{bin_key(b)}/{metric}" if explainer else f"{bin_key(b)}/{metric}"
            out[f"{PREFIX}/{name}"] = nanmean(values.detach().cpu()[rows])
        out[f"{PREFIX}/{bin_key(b)}/probe_count"] = float(rows.sum())
    return out
