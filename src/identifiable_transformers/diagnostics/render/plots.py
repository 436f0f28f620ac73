"""Figures for the identifiability diagnostics (matplotlib, Agg, no pyplot global state).

- ``plot_null_dim_vs_length``: measured null dims against input length, with the generic
  theoretical lines max(0, n - d/h) (concat) and max(0, n - d) (add), docs/identifiability.md 2.1-2.2.
- ``plot_attention_maps``: per layer and head, the raw map, Brunner's effective attention and
  the witness alternative side by side (docs/identifiability.md 2.3-2.4), with token labels.

Figures are built with ``matplotlib.figure.Figure`` directly (Agg canvas), so they work in
headless training jobs and never touch a GUI backend.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ...common.files import atomic_path  # noqa: E402

__all__ = ["figure_to_png", "plot_attention_maps", "plot_null_dim_vs_length", "save_figure"]

_MAX_LABELLED_TOKENS = 64  # beyond this, tick labels are thinned out


def save_figure(fig: Figure, path: str | Path, dpi: int = 80) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:  # a temporary name, renamed once whole (identifiable_transformers.common.files)
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=dpi)
    return path


def figure_to_png(fig: Figure, dpi: int = 80) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def plot_null_dim_vs_length(
    lengths,
    null_dim,
    stochastic_null_dim,
    *,
    embed_dim: int,
    num_heads: int,
    value_dim: int | None = None,
    head_combine: str | None = None,
    title: str | None = None,
) -> Figure:
    """Scatter of per-(example, layer, head) null dims vs length n, with theory lines.

    lengths [B]; null_dim, stochastic_null_dim [B, L, H]. The lines are the generic values for
    the two designs at this width: concat max(0, n - d/h), add max(0, n - d) (and -1 each for the
    row-stochastic variant); ``value_dim`` (the model's own d_v) adds a dashed line.
    """
    n = _np(lengths).astype(float)
    nd, snd = _np(null_dim).astype(float), _np(stochastic_null_dim).astype(float)
    B = n.shape[0]
    per = nd.reshape(B, -1).shape[1]
    # A small deterministic horizontal jitter separates heads sharing a length.
    jitter = (np.arange(per) - (per - 1) / 2) * (0.3 / max(per, 1))
    xs = (n[:, None] + jitter[None, :]).ravel()
    grid = np.arange(0, max(n.max(), embed_dim + 2) + 2)
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2, sharex=True)
    for ax, vals, shift, name in ((axes[0], nd, 0, "null_dim = n - rank(T)"),
                                  (axes[1], snd, 1, "stochastic_null_dim = n - rank([T, 1])")):
        ax.scatter(xs, vals.reshape(B, -1).ravel(), s=10, alpha=0.5, color="k", label="measured (example, head)")
        ax.plot(grid, np.maximum(0, grid - embed_dim // num_heads - shift), color="tab:red",
                label=f"concat: n - d/h{' - 1' if shift else ''} (d/h={embed_dim // num_heads})")
        ax.plot(grid, np.maximum(0, grid - embed_dim - shift), color="tab:blue",
                label=f"add: n - d{' - 1' if shift else ''} (d={embed_dim})")
        if value_dim is not None and value_dim not in (embed_dim, embed_dim // num_heads):
            ax.plot(grid, np.maximum(0, grid - value_dim - shift), "--", color="tab:green",
                    label=f"this model: n - d_v{' - 1' if shift else ''} (d_v={value_dim})")
        ax.set_xlim(0, n.max() + 2)
        ax.set_ylim(-0.5, max(1.0, vals.max(), n.max() - embed_dim // num_heads) + 1)
        ax.set_xlabel("input length n (real tokens)")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("dimension")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title or f"null dims vs length ({head_combine or 'model'}, d={embed_dim}, h={num_heads})", fontsize=11)
    return fig


def _ticks(ax, tokens: Sequence[str] | None, n: int, x: bool, y: bool) -> None:
    """Token labels: x (keys) only on the bottom row, y (queries) only on the first column, since
    every panel shows the same tokens. Labels are plain Text artists rather than ticks: a Tick is
    five artists, and ticks were most of the drawing time of these figures."""
    ax.set_xticks([])
    ax.set_yticks([])
    pos = np.arange(0, n, 1 if n <= _MAX_LABELLED_TOKENS else int(np.ceil(n / _MAX_LABELLED_TOKENS)))
    size = 7 if n <= 16 else 5 if n <= 40 else 4
    labels = [tokens[i] for i in pos] if tokens is not None else [str(i) for i in pos]
    if x:
        tx = ax.get_xaxis_transform()
        for p, lab in zip(pos, labels):
            ax.text(p, -0.01, lab, transform=tx, rotation=90, ha="center", va="top", fontsize=size, clip_on=False)
    if y:
        ty = ax.get_yaxis_transform()
        for p, lab in zip(pos, labels):
            ax.text(-0.01, p, lab, transform=ty, ha="right", va="center", fontsize=size, clip_on=False)


def plot_attention_maps(
    attention,
    effective,
    alternative,
    *,
    tokens: Sequence[str] | None = None,
    alt_tv=None,
    rel_error=None,
    null_dim=None,
    stochastic_null_dim=None,
    title: str | None = None,
) -> Figure:
    """Rows = (layer, head); columns = raw A, effective A_eff, witness alternative A'.

    attention / effective / alternative: [L, H, n, n] on real tokens. Raw and alternative share
    one colour scale (both are distributions); A_eff has negative entries, so it gets a diverging
    scale centred at 0. alt_tv, rel_error, null dims: [L, H], shown in the panel titles.
    """
    A, E, W = _np(attention), _np(effective), _np(alternative)
    L, H, n, _ = A.shape
    rows = L * H
    side = 2.4 if n <= 40 else 3.2
    fig = Figure(figsize=(3 * side + 1.2, rows * side + 1.4))
    # Fixed margins (tight_layout would cost a full extra draw); the last grid row holds the bars.
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.05 if n > 16 else 0.03,
                        top=1 - 0.8 / (rows * side + 1.4), wspace=0.15, hspace=0.22)
    gs = fig.add_gridspec(rows + 1, 3, height_ratios=[1.0] * rows + [0.04 * rows + 0.02])
    axes = np.array([[fig.add_subplot(gs[r, c]) for c in range(3)] for r in range(rows)])
    caxes = [fig.add_subplot(gs[rows, c]) for c in range(3)]
    # One scale per column for all heads (comparable across heads, and 3 colour bars instead of
    # 3 L H: colour bars and text dominate the drawing time).
    vmax = float(max(A.max(), W.max(), 1e-12))
    emax = float(max(np.abs(E).max(), 1e-12))
    ims = [None, None, None]
    for l in range(L):
        for h in range(H):
            r = l * H + h
            ims = [
                axes[r, 0].imshow(A[l, h], vmin=0, vmax=vmax, cmap="viridis", interpolation="nearest"),
                axes[r, 1].imshow(E[l, h], vmin=-emax, vmax=emax, cmap="RdBu_r", interpolation="nearest"),
                axes[r, 2].imshow(W[l, h], vmin=0, vmax=vmax, cmap="viridis", interpolation="nearest"),
            ]
            nd = f"null {int(_np(null_dim)[l, h])}" if null_dim is not None else ""
            snd = f", stoch. null {int(_np(stochastic_null_dim)[l, h])}" if stochastic_null_dim is not None else ""
            tv = f"TV {float(_np(alt_tv)[l, h]):.3f}" if alt_tv is not None else ""
            err = f", |A'T-AT|/|AT| {float(_np(rel_error)[l, h]):.0e}" if rel_error is not None else ""
            axes[r, 0].set_title(f"L{l} H{h} raw A" + (f" ({nd}{snd})" if nd or snd else ""), fontsize=8)
            axes[r, 1].set_title(f"L{l} H{h} effective A_eff", fontsize=8)
            axes[r, 2].set_title("witness A'" + (f" ({tv}{err})" if tv or err else ""), fontsize=8)
            for c in range(3):
                _ticks(axes[r, c], tokens, n, x=r == rows - 1, y=c == 0)
    for c, label in enumerate(("attention weight", "A_eff (signed)", "attention weight")):
        cb = fig.colorbar(ims[c], cax=caxes[c], orientation="horizontal")
        cb.ax.tick_params(labelsize=6)
        cb.set_label(label, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
