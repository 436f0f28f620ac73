"""Aggregate a sweep: python -m identifiable_transformers.report SWEEP_DIR [--out DIR]

Reads every job's ``metrics.json`` under SWEEP_DIR and writes ``results.csv`` (one row per job),
``results.md`` (mean ± std per configuration) and plots of accuracy and identifiability against
the key size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

COLUMNS = {  # column -> key in metrics.json["metrics"]
    "test_acc": "test/acc",
    "test_f1": "test/f1",
    "val_acc_best": "val/acc_best",
    "identifiable_frac": "val/ident/identifiable_frac",
    "null_dim": "val/ident/null_dim",
    "stochastic_null_dim": "val/ident/stochastic_null_dim",
    "alt_tv": "val/ident/alt_tv",
}
GROUP = ["data", "head_combine", "embed_dim", "num_heads", "key_dim", "value_dim"]


def load_runs(sweep_dir: Path) -> pd.DataFrame:
    # a run's W&B folder holds a copy (files/metrics.json): count each run once
    files = sorted(f for f in sweep_dir.rglob("metrics.json") if "wandb" not in f.relative_to(sweep_dir).parts)
    if not files:
        raise FileNotFoundError(f"no metrics.json under {sweep_dir}: pass the directory of a finished sweep")
    rows = []
    for f in files:
        result = json.loads(f.read_text())
        model, metrics = result["config"]["model"], result["metrics"]
        d, h, combine = model["embed_dim"], model["num_heads"], model["head_combine"]
        rows.append({
            "run": str(f.parent.relative_to(sweep_dir)),
            "data": result["config"]["data"],
            "seed": result["config"]["seed"],
            "head_combine": combine,
            "embed_dim": d,
            "num_heads": h,
            # resolve the null defaults as the model does (docs/identifiability.md section 3)
            "key_dim": model["key_dim"] or d // h,
            "value_dim": model["value_dim"] or (d // h if combine == "concat" else d),
            "best_epoch": result.get("best_epoch"),
            "runtime_s": result.get("runtime_s"),
            **{col: metrics.get(key) for col, key in COLUMNS.items()},
        })
    return pd.DataFrame(rows)


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    present = [c for c in COLUMNS if runs[c].notna().any()]
    table = runs.groupby(GROUP)[present].agg(["mean", "std"])
    table.columns = [f"{c}_{stat}" for c, stat in table.columns]
    table["runs"] = runs.groupby(GROUP).size()
    return table.reset_index()


def to_markdown(table: pd.DataFrame) -> str:
    metrics = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    header = GROUP + metrics + ["runs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [str(row[c]) for c in GROUP]
        for m in metrics:
            mean, std = row[f"{m}_mean"], row[f"{m}_std"]
            cells.append("n/a" if pd.isna(mean) else f"{mean:.4f} ± {0.0 if pd.isna(std) else std:.4f}")
        cells.append(str(row["runs"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: SWEEP_DIR)")
    args = parser.parse_args(argv)
    out = args.out or args.sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(args.sweep_dir)
    table = summarise(runs)
    runs.to_csv(out / "results.csv", index=False)
    (out / "results.md").write_text(to_markdown(table))
    plots = plot(table, out)
    print(f"{len(runs)} runs, {len(table)} configurations -> {out / 'results.md'}, {out / 'results.csv'}, "
          f"{', '.join(p.name for p in plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
