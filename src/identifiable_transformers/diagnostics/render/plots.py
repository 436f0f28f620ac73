"""Figures for the identifiability diagnostics (matplotlib, Agg, no pyplot global state).

- ``plot_null_dim_vs_length``: measured null dims against input length, with the generic
  theoretical lines max(0, n - d/h) (concat) and max(0, n - d) (add), docs/identifiability.md 2.1-2.2.
- ``plot_attention_maps``: per layer and head, the raw map, Brunner's effective attention and
  the witness alternative side by side (docs/identifiability.md 2.3-2.4), with token labels: one row per
  head, so only for small models (the report and the callback draw ``plot_attention_grid``).
- ``plot_attention_grid``: the same three maps as layers x heads grids of small multiples (one panel per
  kind), block-averaged thumbnails, never over ``MAX_PNG_SIDE`` pixels on a side.
- ``plot_head_overview``: one cell per layer and head coloured by a measure (the report's overview; logged to
  W&B each epoch by the identifiability callback).

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

__all__ = ["MAX_PNG_SIDE", "block_mean", "figure_to_png", "plot_attention_grid", "plot_attention_maps",
           "plot_head_overview", "plot_null_dim_vs_length", "save_figure"]

_MAX_LABELLED_TOKENS = 64  # beyond this, tick labels are thinned out
MAX_PNG_SIDE = 4000  # pixels: no figure of plot_attention_grid is larger on either side (at its dpi)
_GRID_DPI = 100


def block_mean(maps: np.ndarray, side: int) -> tuple[np.ndarray, int]:
    """``maps`` [..., n, n] averaged over f x f blocks, f = ceil(n / side): ([..., ceil(n / f), ceil(n / f)], f).

    A last, partial block is the mean of the entries it holds (not diluted by padding), so a row-stochastic map
    stays a map of mean weights and f = 1 returns the maps themselves."""
    n = maps.shape[-1]
    f = max(1, -(-n // side))
    if f == 1:
        return maps, 1
    m = -(-n // f)
    padded = np.zeros((*maps.shape[:-2], m * f, m * f), dtype=np.float64)
    padded[..., :n, :n] = maps
    sums = padded.reshape(*maps.shape[:-2], m, f, m, f).sum(axis=(-3, -1))
    counts = np.minimum(f, n - np.arange(m) * f).astype(np.float64)  # real rows (columns) in each block
    return sums / (counts[:, None] * counts[None, :]), f


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


def _tiles(maps: np.ndarray, t: int, cmap: str, signed: bool) -> np.ndarray:
    """[L, H, n, n] maps as [L, H, t, t, 3] RGB thumbnails, each scaled to its own max |value|."""
    from matplotlib import colormaps

    small, _ = block_mean(maps, t)
    m = small.shape[-1]
    idx = np.arange(t) * m // t  # nearest-neighbour resampling to t x t pixels
    small = small[..., idx[:, None], idx[None, :]]
    top = np.maximum(np.abs(small).max(axis=(-2, -1), keepdims=True), 1e-12)
    scaled = 0.5 + 0.5 * small / top if signed else small / top
    return colormaps[cmap](scaled)[..., :3]


def plot_attention_grid(
    panels: dict[str, np.ndarray],
    *,
    null_dim=None,
    stochastic_null_dim=None,
    title: str | None = None,
) -> Figure:
    """One layers x heads grid of small multiples per entry of ``panels`` ({caption: [L, H, n, n] maps}), stacked.

    Each thumbnail is the head's map block-averaged to at most the tile's side and scaled to its own max (signed
    maps, a caption starting "effective", on a diverging scale around 0), so the grid shows each head's pattern;
    the numbers are in the HTML report. A head whose ``stochastic_null_dim`` is 0 is identifiable: its tile in a
    panel whose caption starts "witness" is left grey (its witness is the map itself), and every tile of such a
    head has a green frame, the others a red one. Tiles shrink so that the figure stays within ``MAX_PNG_SIDE``
    pixels on each side; the title sits in a band of its own above the grids.
    """
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    names = list(panels)
    L, H = next(iter(panels.values())).shape[:2]
    stoch = None if stochastic_null_dim is None else _np(stochastic_null_dim)
    nd = None if null_dim is None else _np(null_dim)
    gap, left, right, top_band, head_band, caption_band, bottom = 4, 44, 12, 40, 18, 20, 12
    rows = len(names) * L
    fit_h = (MAX_PNG_SIDE - top_band - bottom - len(names) * (head_band + caption_band)) // rows - gap
    fit_w = (MAX_PNG_SIDE - left - right) // H - gap
    t = int(max(4, min(64, fit_h, fit_w)))
    panel_w, panel_h = H * (t + gap) - gap, L * (t + gap) - gap
    width = max(left + panel_w + right, 360)
    height = top_band + len(names) * (caption_band + head_band + panel_h) + bottom
    fig = Figure(figsize=(width / _GRID_DPI, height / _GRID_DPI), dpi=_GRID_DPI)
    if title:
        fig.text(0.5, 1 - 12 / height, title, ha="center", va="top", fontsize=11)
    y = height - top_band
    for name in names:
        maps = _np(panels[name]).astype(np.float64)
        signed = name.startswith("effective")
        tiles = _tiles(maps, t, "RdBu_r" if signed else "viridis", signed)
        mosaic = np.ones((panel_h, panel_w, 3))
        for l in range(L):
            for h in range(H):
                r0, c0 = l * (t + gap), h * (t + gap)
                blank = name.startswith("witness") and stoch is not None and stoch[l, h] == 0
                mosaic[r0 : r0 + t, c0 : c0 + t] = 0.85 if blank else tiles[l, h]
        y -= caption_band
        fig.text(left / width, y / height, name, ha="left", va="bottom", fontsize=9, weight="bold")
        y -= head_band + panel_h
        ax = fig.add_axes((left / width, y / height, panel_w / width, panel_h / height))
        ax.imshow(mosaic, interpolation="nearest", extent=(0, panel_w, panel_h, 0))
        ax.set_xlim(0, panel_w)
        ax.set_ylim(panel_h, 0)
        ax.set_axis_off()
        for h in range(H):
            ax.text(h * (t + gap) + t / 2, -3, f"H{h}", ha="center", va="bottom", fontsize=7, clip_on=False)
        if stoch is not None:  # one collection: a patch per tile would dominate the drawing time
            ax.add_collection(PatchCollection(
                [Rectangle((h * (t + gap) - 1, l * (t + gap) - 1), t + 1, t + 1) for l in range(L) for h in range(H)],
                facecolor="none", linewidth=1,
                edgecolor=["#17702a" if stoch[l, h] == 0 else "#b3261e" for l in range(L) for h in range(H)]))
        for l in range(L):
            ax.text(-4, l * (t + gap) + t / 2, f"L{l}", ha="right", va="center", fontsize=7, clip_on=False)
            for h in range(H):
                if nd is not None and t >= 20:
                    ax.text(h * (t + gap) + 2, l * (t + gap) + 2, str(int(nd[l, h])), ha="left", va="top",
                            fontsize=6, color="white", clip_on=True)
    return fig


def plot_head_overview(panels: dict, *, title: str | None = None, not_identifiable=None) -> Figure:
    """The report's overview as a picture: per entry of ``panels`` ({label: [L, H] values}) one grid of a cell per
    layer (row) and head (column), coloured by the value (viridis from 0 to the panel's largest) and showing it; the
    first grid's last column is, with ``not_identifiable`` [L, H] (booleans), how many of the layer's heads are not
    identifiable, else each grid's last column is the layer's mean."""
    grids = {k: _np(v).astype(np.float64) for k, v in panels.items()}
    L, H = next(iter(grids.values())).shape
    cell = 0.42
    fig = Figure(figsize=(len(grids) * ((H + 2.4) * cell + 1.0) + 0.4, L * cell + 1.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(grids)))
    for i, (ax, (label, v)) in enumerate(zip(axes, grids.items())):
        top = max(float(v.max()), 1e-12)
        small = top < 10 and not np.allclose(v, np.round(v))
        fmt = "{:.2f}" if small else "{:.1f}" if not np.allclose(v, np.round(v)) else "{:.0f}"
        im = ax.imshow(v, vmin=0, vmax=top, cmap="viridis", aspect="equal")
        counts = i == 0 and not_identifiable is not None
        for l in range(L):
            for h in range(H):
                ax.text(h, l, fmt.format(v[l, h]).replace("0.", ".", 1) if small else fmt.format(v[l, h]),
                        ha="center", va="center", fontsize=6.5, color="black" if v[l, h] > 0.6 * top else "white")
            total = (f"{int(_np(not_identifiable)[l].astype(bool).sum())}/{H}" if counts
                     else fmt.format(v[l].mean()))
            ax.text(H - 0.2, l, total, ha="left", va="center", fontsize=7.5)
        ax.text(H - 0.2, -0.75, "not ident." if counts else "mean", ha="left", va="center", fontsize=7)
        ax.set_xticks(range(H), [f"H{h}" for h in range(H)], fontsize=7)
        ax.set_yticks(range(L), [f"L{l}" for l in range(L)], fontsize=7)
        ax.set_xlim(-0.5, H + 1.3)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(length=0)
        cb = fig.colorbar(im, ax=ax, shrink=0.8, pad=0.01)
        cb.ax.tick_params(labelsize=7)
        cb.set_label(label, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
