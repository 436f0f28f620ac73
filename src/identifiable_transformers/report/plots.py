"""Plots of the results table: accuracy and identifiable fraction against the key size."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


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
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
