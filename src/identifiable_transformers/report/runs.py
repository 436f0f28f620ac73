"""The runs of a sweep (one row per job's ``metrics.json``) and the results table (mean ± std per configuration)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .markdown import markdown_table

COLUMNS = {  # column -> key in metrics.json["metrics"]
    "test_acc": "test/acc",
    "test_f1": "test/f1",
    "val_acc_best": "val/acc_best",
    "identifiable_frac": "val/ident/identifiable_frac",
    "null_dim": "val/ident/null_dim",
    "stochastic_null_dim": "val/ident/stochastic_null_dim",
    "alt_tv": "val/ident/alt_tv",
    "uniform_acc_gap": "val/faith/uniform_acc_gap",
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
            # every faithfulness metric, per-epoch ones and the end-of-fit val/faith/final/*
            **{k[len("val/"):]: v for k, v in sorted(metrics.items())
               if k.startswith("val/faith/") and k != "val/faith/uniform_acc_gap"},
            "_dir": str(f.parent),
            "_best_model_path": result.get("best_model_path"),
        })
    return pd.DataFrame(rows)


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    present = [c for c in COLUMNS if c in runs and runs[c].notna().any()]
    table = runs.groupby(GROUP)[present].agg(["mean", "std"])
    table.columns = [f"{c}_{stat}" for c, stat in table.columns]
    table["runs"] = runs.groupby(GROUP).size()
    return table.reset_index()


def to_markdown(table: pd.DataFrame) -> str:
    return markdown_table(table, GROUP)
