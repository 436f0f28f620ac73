"""Figures and W&B media of the identifiability callback: heatmaps, the layer x head overview, the probe table, async
rendering.

Kept apart from the callback's hooks (identifiability.py), which decide *when* to diagnose; this module
decides how results are drawn and sent. ``_render`` touches no trainer state, so it can run in a
worker thread.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from ...tracking.wandb_logging import log_epoch_media, logged_step, wandb_loggers
from ..maths import attention_identifiability

log = logging.getLogger(__name__)

_TABLE_CHUNK = 8  # probes per identifiability call when building the end-of-fit W&B table
PROBE_COLUMNS = ["example", "length", "text", "layer", "head", "null_dim", "stochastic_null_dim", "identifiable",
                 "alt_tv", "effective_gap", "attention"]


def attention_image(weights: np.ndarray, pixels: int = 128) -> np.ndarray:
    """An n x n attention map as an RGB uint8 heatmap (viridis, scaled to its max), about ``pixels`` wide.

    A map wider than ``pixels`` is averaged over f x f blocks (f = ceil(n / pixels)), so a 512-token map is a
    128-pixel image, not a 512-pixel one (the probe spans every length up to the data's max_length)."""
    from matplotlib import colormaps

    n = weights.shape[0]
    if n > pixels:
        f = -(-n // pixels)
        padded = np.zeros((-(-n // f) * f,) * 2, dtype=np.float64)
        padded[:n, :n] = weights
        weights = padded.reshape(padded.shape[0] // f, f, -1, f).mean(axis=(1, 3))
    scaled = weights / max(float(weights.max()), 1e-12)
    rgb = (colormaps["viridis"](scaled)[..., :3] * 255).astype(np.uint8)
    k = max(1, pixels // max(weights.shape[0], 1))
    return rgb.repeat(k, axis=0).repeat(k, axis=1)


def overview_figure(report: dict[str, Any], epoch: int):
    """The probe's layer x head overview of one epoch, as the analyze report's: per head the mean null dim and the mean
    witness TV over the probe examples; per layer, how many heads are not identifiable (stochastic null dim > 0) on
    at least one of them."""
    from ..render.plots import plot_head_overview

    B = report["null_dim"].shape[0]
    return plot_head_overview(
        {"mean null dim": report["null_dim"].double().mean(0), "mean witness TV": report["alt_attention_tv"].double()
         .mean(0)}, not_identifiable=(report["stochastic_null_dim"] > 0).any(0),
        title=f"epoch {epoch}: layer x head overview over {B} probe example(s), up to {int(report['lengths'].max())} "
              "tokens")


class IdentifiabilityMedia:
    """Mixin of IdentifiabilityCallback: figures (sync or in a worker thread) and W&B media."""

    # ------------------------------------------------------------------------------- overview
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The epoch's layer x head overview to W&B (``val/ident/overview``, an image), every epoch the diagnostics
        ran: Lightning runs the epoch's validation, and so the diagnostics, before this hook."""
        epoch = trainer.current_epoch
        report = getattr(self, "last_report", None)
        if (report is None or getattr(self, "_last_epoch", None) != epoch or not trainer.is_global_zero
                or getattr(self, "_overview_epoch", None) == epoch or not wandb_loggers(trainer)):
            return
        self._overview_epoch = epoch
        import io

        import wandb
        from PIL import Image

        from ..render.plots import figure_to_png

        image = Image.open(io.BytesIO(figure_to_png(overview_figure(report, epoch), dpi=100)))
        log_epoch_media(trainer, {"val/ident/overview": wandb.Image(image, caption=f"epoch {epoch}")}, epoch,
                        logged_step(trainer), same_row=False)

    # ------------------------------------------------------------------------------------ plots
    def _plots_now(self, trainer: pl.Trainer) -> bool:
        epoch = trainer.current_epoch
        last = trainer.max_epochs is not None and epoch == trainer.max_epochs - 1
        return self.plots and ((epoch + 1) % self.plot_every_n_epochs == 0 or last)

    def _plot_positions(self, lengths: list[int], max_length: int | None = None) -> list[int]:
        """Probe positions to draw: spread over the upper three quarters of the probes of at most ``max_length``
        tokens (the probe is sorted by length; a heatmap with a label per token is unreadable far beyond that)."""
        shown = len(lengths) if max_length is None else sum(n <= max_length for n in lengths)
        k = min(self.num_plot_examples, shown)
        if k == 0:
            return []
        quantiles = np.linspace(0.25, 1.0, k) if k > 1 else np.array([0.75])
        return sorted({int(round(q * (shown - 1))) for q in quantiles})

    def _plot(self, trainer, pl_module, report, probe, out: Path) -> None:
        """Copy what the figures need, then render them (in a worker thread when ``async_plots``)."""
        model = pl_module.model
        epoch = trainer.current_epoch
        job: dict[str, Any] = {
            "out": out, "epoch": epoch, "step": logged_step(trainer),
            "lengths": report["lengths"].numpy(), "null_dim": report["null_dim"].numpy(),
            "stochastic_null_dim": report["stochastic_null_dim"].numpy(),
            "model": dict(embed_dim=model.embed_dim, num_heads=model.num_heads, value_dim=model.value_dim,
                          head_combine=model.head_combine), "examples": [],
        }
        # Heatmaps of probes up to 2d + 2 tokens, as before the probe spanned every length. Their maps are computed
        # here, for these examples only: maps of the whole probe at 512 tokens would take about a gigabyte.
        positions = self._plot_positions(probe["lengths"], 2 * model.embed_dim + 2)
        if positions:
            rows = torch.tensor(positions)
            ids, mask = probe["batch"]["input_ids"][rows], probe["batch"]["attention_mask"][rows]
            width = int(mask.sum(1).max())
            shown = attention_identifiability(model, ids[:, :width].to(pl_module.device),
                                              mask[:, :width].to(pl_module.device), return_maps=True,
                                              device=self.maths_device(pl_module))
        for j, pos in enumerate(positions):
            n = int(shown["lengths"][j])
            m = shown["maps"][j]
            job["examples"].append({
                "index": probe["indices"][pos], "n": n,
                "tokens": probe["tokens"][pos][:n] if probe["tokens"] is not None else [str(i) for i in range(n)],
                **{k: m[k].numpy() for k in ("attention", "effective", "alternative")},
                **{k: shown[k][j].numpy() for k in ("alt_attention_tv", "witness_rel_error", "null_dim",
                                                    "stochastic_null_dim")},
            })
        background = self.async_plots if self.async_plots is not None else pl_module.device.type != "cpu"
        if background:
            self._flush(trainer, wait=False)
            if self._executor is None:
                from concurrent.futures import ThreadPoolExecutor

                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ident-plots")
            self._pending.append(self._executor.submit(_render, job))
        else:  # before Lightning logs this epoch's scalars: the images join their history row
            self._log_wandb(trainer, _render(job), same_row=True)

    def _flush(self, trainer: pl.Trainer, wait: bool) -> None:
        """Send finished renders to W&B from the main thread (all of them when ``wait``)."""
        still = []
        for fut in self._pending:
            if wait or fut.done():
                try:
                    self._log_wandb(trainer, fut.result())
                except Exception as err:  # a failed figure must not kill training
                    log.warning("identifiability plots failed: %s", err)
            else:
                still.append(fut)
        self._pending = still

    def _log_probe_table(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Every probe example, layer and head of the final model: text, null dims, verdict, attention."""
        import wandb

        probe, batch = self._probe, self._probe["batch"]
        rows = []
        for pos, index in enumerate(probe["indices"]):
            if pos % _TABLE_CHUNK == 0:  # the maps of a few probes at a time: at 512 tokens all would take a gigabyte
                ids = batch["input_ids"][pos : pos + _TABLE_CHUNK]
                mask = batch["attention_mask"][pos : pos + _TABLE_CHUNK]
                width = int(mask.sum(1).max())
                report = attention_identifiability(pl_module.model, ids[:, :width].to(pl_module.device),
                                                   mask[:, :width].to(pl_module.device), return_maps=True,
                                                   device=self.maths_device(pl_module))
            r = pos % _TABLE_CHUNK
            n = int(report["lengths"][r])
            text = " ".join(probe["tokens"][pos][:n]) if probe["tokens"] is not None else ""
            attention = report["maps"][r]["attention"].numpy()  # [L, H, n, n]
            for l in range(attention.shape[0]):
                for h in range(attention.shape[1]):
                    nd = int(report["null_dim"][r, l, h])
                    rows.append([index, n, text, l, h, nd, int(report["stochastic_null_dim"][r, l, h]), nd == 0,
                                 float(report["alt_attention_tv"][r, l, h]),
                                 float(report["effective_gap"][r, l, h]),
                                 wandb.Image(attention_image(attention[l, h]))])
        log_epoch_media(trainer, {"val/ident/probe": wandb.Table(columns=PROBE_COLUMNS, data=rows)},
                        self._last_epoch, logged_step(trainer), same_row=False)

    @staticmethod
    def _log_wandb(trainer: pl.Trainer, rendered: dict[str, Any], same_row: bool = False) -> None:
        """Log one epoch's figures with that epoch's ``epoch`` and ``trainer/global_step``."""
        if not wandb_loggers(trainer):
            return
        import wandb

        images = {"val/ident/null_dim_vs_length": [wandb.Image(p) for p in rendered["null_dim_vs_length"]]}
        if rendered["attention"]:
            images["val/ident/attention"] = [wandb.Image(p, caption=c)
                                             for p, c in zip(rendered["attention"], rendered["captions"])]
        log_epoch_media(trainer, images, rendered["epoch"], rendered["step"], same_row)


def _render(job: dict[str, Any]) -> dict[str, Any]:
    """Draw and save one epoch's figures (runs in the plot thread: touches no trainer state)."""
    from ..render.plots import plot_attention_grid, plot_null_dim_vs_length, save_figure

    out, epoch, cfg = job["out"], job["epoch"], job["model"]
    fig = plot_null_dim_vs_length(
        job["lengths"], job["null_dim"], job["stochastic_null_dim"], **cfg,
        title=f"epoch {epoch}: null dims vs length ({cfg['head_combine']}, d={cfg['embed_dim']}, "
              f"h={cfg['num_heads']}, d_v={cfg['value_dim']})",
    )
    rendered = {"epoch": epoch, "step": job["step"],
                "null_dim_vs_length": [str(save_figure(fig, out / "null_dim_vs_length.png"))],
                "attention": [], "captions": []}
    for ex in job["examples"]:
        fig = plot_attention_grid(
            {"raw A": ex["attention"], "effective A_eff": ex["effective"],
             "witness A' (grey: identifiable, no witness)": ex["alternative"]},
            null_dim=ex["null_dim"], stochastic_null_dim=ex["stochastic_null_dim"],
            title=f"epoch {epoch}, validation example {ex['index']} (n={ex['n']}); frame green = identifiable",
        )
        rendered["attention"].append(str(save_figure(fig, out / f"attention_val{ex['index']}.png", dpi=fig.dpi)))
        rendered["captions"].append(f"val example {ex['index']}, n={ex['n']}")
    return rendered
