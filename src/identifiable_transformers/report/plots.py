"""Plots of the report: accuracy and identifiable fraction against the key size; key-aware alternatives against
length."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..common.files import atomic_path


def plot(table: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for metric, label in (("test_acc", "test accuracy"), ("identifiable_frac", "identifiable fraction (probe set)")):
        if f"{metric}_mean" not in table:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for (data, combine), g in table.groupby(["data", "head_combine"]):
            g = g.sort_values("key_dim")
            ax.errorbar(g["key_dim"], g[f"{metric}_mean"], yerr=g[f"{metric}_std"].fillna(0), marker="o",
                        capsize=3, label=f"{data} / {combine}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("key_dim")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{metric}_vs_key_dim.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def plot_key_aware(table: pd.DataFrame, out: Path) -> list[Path]:
    """Key-aware alternatives against input length, one panel per design, one line per key size
    (solid: trained heads, dashed: matched random heads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    designs = sorted(table["head_combine"].unique())
    fig, axes = plt.subplots(1, len(designs), figsize=(5 * len(designs), 3.8), squeeze=False)
    for ax, combine in zip(axes[0], designs):
        part = table[table["head_combine"] == combine]
        for i, (key_dim, g) in enumerate(part.groupby("key_dim")):
            g = g.sort_values("n")
            color = f"C{i}"
            ax.plot(g["n"], g["alternative_dim_mean"] + 1, marker="o", color=color, label=f"d_k={key_dim}")
            if "random_alternative_dim_mean" in g:
                ax.plot(g["n"], g["random_alternative_dim_mean"] + 1, ls="--", color=color, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("input length n (tokens)")
        ax.set_ylabel("alternatives + 1 (mean over heads)")
        ax.set_title(f"{combine} (dashed: random heads, same shapes and norms)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "key_aware_vs_length.png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return [path]
