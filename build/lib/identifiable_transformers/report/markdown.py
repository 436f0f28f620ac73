"""Markdown tables of the report: key columns, then each metric as mean ± std."""

from __future__ import annotations

import pandas as pd


def markdown_table(table: pd.DataFrame, keys: list[str], digits: int = 4) -> str:
    """One row per line: the key columns, then every ``<m>_mean``/``<m>_std`` pair as mean ± std."""
    metrics = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    extra = [c for c in ("identifiable_heads", "margin_min", "runs", "pairs", "examples") if c in table]
    header = keys + metrics + extra
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [str(row[c]) for c in keys]
        for m in metrics:
            mean = row[f"{m}_mean"]
            if pd.isna(mean):
                cells.append("n/a")
            elif f"{m}_std" not in table:  # a mean over all runs' examples, no spread column
                cells.append(f"{mean:.{digits}f}")
            else:
                std = row[f"{m}_std"]
                cells.append(f"{mean:.{digits}f} ± {0.0 if pd.isna(std) else std:.{digits}f}")
        cells += [f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c]) for c in extra]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
