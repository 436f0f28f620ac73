"""Aggregate a sweep: python -m identifiable_transformers.report SWEEP_DIR [--out DIR] [--no-key-aware]

Reads every job's ``metrics.json`` under SWEEP_DIR and writes ``results.csv`` (one row per job, every
``val/faith/*`` metric included), ``results.md`` (mean ± std per configuration) and plots of accuracy
and identifiability against the key size. When the runs logged the faithfulness suite
(docs/faithfulness.md) it also writes ``faithfulness.md``/``.csv`` (mean ± std over seeds per
configuration and explainer) and ``seed_agreement.md``/``.csv`` (Jensen-Shannon divergence between the
seeds' explanations of the same probe examples, from each run's ``identifiability/explanations.json``).
``key_aware.md``/``.csv`` tabulate the docs/identifiability.md 2.5 key-aware count of alternatives per
checkpoint, computed into ``<run>/identifiability/key_aware.json`` when missing (``--no-key-aware``:
use only the files already there).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

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
FAITH_KEY = re.compile(r"^val/faith/([a-z_]+)/(comprehensiveness|sufficiency|tau_loo|flip_frac)$")
FAITH_METRICS = ("comprehensiveness", "sufficiency", "tau_loo", "flip_frac")
EXPLAINER_ORDER = ("attention", "effective", "norm", "rollout", "grad_input", "integrated_gradients", "loo", "random")
# Explainers whose scores are non-negative, so that renormalised they are distributions over the tokens.
DISTRIBUTION_EXPLAINERS = ("attention", "norm", "rollout")
# Key-aware count (docs/identifiability.md 2.5): probe examples nearest these lengths (<cls> included).
# Dense float64 Jacobians of size n^2 x 2n*d_k make it slow beyond ~20 tokens at d_k = 64; 12 lies
# below the baseline's row-stochastic bound d/h + 1 = 17 (no alternatives of any kind), 20 above it.
KEY_AWARE_LENGTHS = (12, 20)
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


def _markdown(table: pd.DataFrame, keys: list[str], digits: int = 4) -> str:
    """One row per line: the key columns, then every ``<m>_mean``/``<m>_std`` pair as mean ± std."""
    metrics = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    extra = [c for c in ("runs", "pairs", "examples") if c in table]
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
        cells += [str(row[c]) for c in extra]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_markdown(table: pd.DataFrame) -> str:
    return _markdown(table, GROUP)


# ------------------------------------------------------------------------------------ faithfulness
def _faith_column(runs: pd.DataFrame, explainer: str, metric: str) -> str | None:
    """Per-epoch ``faith/<e>/<m>``, else the end-of-fit ``faith/final/<e>/<m>`` (integrated gradients)."""
    for col in (f"faith/{explainer}/{metric}", f"faith/final/{explainer}/{metric}"):
        if col in runs and runs[col].notna().any():
            return col
    return None


def faithfulness_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Mean ± std over seeds of every explainer's comprehensiveness, sufficiency, tau_loo and flip_frac."""
    found = {m.group(1) for c in runs.columns if (m := FAITH_KEY.match("val/" + c.replace("faith/final/", "faith/")))}
    if not found:
        return None
    explainers = [e for e in EXPLAINER_ORDER if e in found] + sorted(found - set(EXPLAINER_ORDER))
    rows = []
    for keys, g in runs.groupby(GROUP):
        for e in explainers:
            row = {**dict(zip(GROUP, keys)), "explainer": e}
            n = 0
            for m in FAITH_METRICS:
                col = _faith_column(runs, e, m)
                vals = g[col].dropna() if col else pd.Series(dtype=float)
                row[f"{m}_mean"], row[f"{m}_std"] = vals.mean(), vals.std()
                n = max(n, len(vals))
            row["runs"] = n
            rows.append(row)
    return pd.DataFrame(rows)


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence in bits (base 2, so it lies in [0, 1]); p, q are renormalised first."""
    p, q = np.asarray(p, float) / np.sum(p), np.asarray(q, float) / np.sum(q)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> float:
        nz = a > 0  # 0 log 0 = 0; m > 0 wherever a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    return 0.5 * kl(p) + 0.5 * kl(q)


def _tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall tau-b of two score vectors (docs/faithfulness.md's ``kendall_tau_b``); NaN when undefined."""
    import torch

    from .diagnostics.faithfulness import kendall_tau_b

    x, y = torch.as_tensor(x)[None], torch.as_tensor(y)[None]
    return float(kendall_tau_b(x, y, torch.ones_like(x, dtype=torch.bool))[0])


def load_explanations(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "identifiability" / "explanations.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _distributions(expl: dict, explainer: str) -> dict[int, np.ndarray]:
    """probe index -> the explainer's scores over the real tokens 1..n-1 (``<cls>`` dropped), renormalised."""
    out = {}
    for idx, n, scores in zip(expl["indices"], expl["lengths"], expl["scores"][explainer]):
        s = np.asarray(scores[1:n], float)
        if (s < 0).any():
            raise ValueError(f"{explainer} scores of probe example {idx} are negative: not a distribution")
        if len(s) and s.sum() > 0:
            out[int(idx)] = s / s.sum()
    return out


def seed_agreement(runs: pd.DataFrame) -> tuple[pd.DataFrame | None, list[str]]:
    """Per configuration (all equal but the seed) and explainer: mean JSD between the seeds' explanations.

    Examples are matched by probe index; the JSD is averaged over the examples two runs share, then over
    the pairs of runs. ``jsd_uniform`` is the mean JSD of each run's explanation to the uniform distribution
    over the same tokens: agreement means little when both explanations are nearly uniform. ``tau_seeds``
    is the Kendall tau-b between the seeds' scores (mean over examples, then pairs): do they rank alike?
    Returns the table and notes about runs that were left out.
    """
    notes, rows = [], []
    for keys, g in runs.groupby(GROUP):
        loaded = []
        for _, r in g.iterrows():
            expl = load_explanations(Path(r["_dir"]))
            if expl is None:
                notes.append(f"{r['run']}: no identifiability/explanations.json (seed agreement without it)")
            else:
                loaded.append((r["seed"], expl))
        if not loaded:
            continue
        for e in DISTRIBUTION_EXPLAINERS:
            dists = [(seed, _distributions(x, e)) for seed, x in loaded if e in x["scores"]]
            if not dists:
                continue
            pair_means, pair_taus, n_examples = [], [], set()
            for (sa, a), (sb, b) in itertools.combinations(dists, 2):
                common = sorted(set(a) & set(b))
                if sa == sb or not common:
                    continue
                if any(len(a[i]) != len(b[i]) for i in common):
                    raise ValueError(f"probe examples of {keys} differ in length between seeds {sa} and {sb}: "
                                     "the runs were not trained on the same data")
                pair_means.append(np.mean([js_divergence(a[i], b[i]) for i in common]))
                taus = [_tau_b(a[i], b[i]) for i in common]
                taus = [t for t in taus if not np.isnan(t)]  # undefined for constant scores or n - 1 < 2
                pair_taus.append(np.mean(taus) if taus else np.nan)
                n_examples.update(common)
            to_uniform = [js_divergence(d, np.ones_like(d)) for _, ds in dists for d in ds.values()]
            rows.append({**dict(zip(GROUP, keys)), "explainer": e,
                         "jsd_seeds_mean": np.mean(pair_means) if pair_means else np.nan,
                         "jsd_seeds_std": np.std(pair_means, ddof=1) if len(pair_means) > 1 else np.nan,
                         "jsd_uniform_mean": np.mean(to_uniform) if to_uniform else np.nan,
                         "tau_seeds_mean": np.nanmean(pair_taus) if np.isfinite(pair_taus).any() else np.nan,
                         "tau_seeds_std": np.nanstd(pair_taus, ddof=1) if np.isfinite(pair_taus).sum() > 1 else np.nan,
                         "pairs": len(pair_means), "examples": len(n_examples)})
    return (pd.DataFrame(rows) if rows else None), notes


# --------------------------------------------------------------------- key-aware count (2.5)
def key_aware_counts(model, input_ids, attention_mask) -> dict:
    """The docs/identifiability.md 2.5 counts of ``key_aware_alternative_dims``, as lists [B][L][H].

    Same maths, cheaper: each head's T (n x d) is replaced by T_r = U_r S_r from its SVD, r = rank(T). T_r
    spans the same column space, so Delta T = 0 exactly when Delta T_r = 0 and rank([T, 1]) = rank([T_r, 1]);
    the map Delta -> Delta T_r has n*r rows instead of n*d (4x fewer for the baseline's d/h = 16), which
    makes its float64 SVD about 16x cheaper. Tested against ``key_aware_alternative_dims``.
    """
    import torch

    from .diagnostics.identifiability import generatable_alternative_dim, value_output_matrices

    model = model.eval()
    captured = {}
    hooks = [getattr(layer.attn, name).register_forward_hook(
                 lambda _m, _i, out, key=(l, name): captured.__setitem__(key, out.detach()))
             for l, layer in enumerate(model.layers) for name in ("q_proj", "k_proj")]
    try:
        with torch.no_grad():
            internals = model.attention_internals(input_ids, attention_mask)
    finally:
        for h in hooks:
            h.remove()
    _, T_all = value_output_matrices(internals)  # (B, L, H, T, d) float64
    B, L, H = T_all.shape[:3]
    lengths = attention_mask.bool().sum(-1).tolist()
    out = {k: [[[0] * H for _ in range(L)] for _ in range(B)] for k in ("alternative_dim", "key_agnostic_dim",
                                                                        "tangent_dim")}
    for l in range(L):
        q = captured[(l, "q_proj")].double().view(B, -1, H, model.key_dim)  # (B, T, H, dk)
        k = captured[(l, "k_proj")].double().view(B, -1, H, model.key_dim)
        for b, n in enumerate(lengths):
            for h in range(H):
                T = T_all[b, l, h, :n]
                U, S, _ = torch.linalg.svd(T, full_matrices=False)
                r = int(torch.linalg.matrix_rank(T))
                res = generatable_alternative_dim(q[b, :n, h], k[b, :n, h], U[:, :r] * S[:r] if r else T)
                for key in out:
                    out[key][b][l][h] = res[key]
    return {**out, "lengths": lengths}


def _probe_batch(run_dir: Path, module, targets=KEY_AWARE_LENGTHS, cache: dict | None = None):
    """The run's probe examples nearest the target lengths, rebuilt from the checkpoint's data config."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    probe = json.loads((run_dir / "identifiability" / "probe.json").read_text())
    picked = []
    for t in targets:
        free = [(abs(n - t), n, i) for i, n in zip(probe["indices"], probe["lengths"]) if i not in picked]
        if free:
            picked.append(min(free)[2])
    data_cfg = module.hparams.get("data_cfg")
    if not data_cfg:
        raise ValueError(f"{run_dir}: the checkpoint has no data_cfg; cannot rebuild its probe examples")
    key = json.dumps(data_cfg, sort_keys=True)
    cache = {} if cache is None else cache
    if key not in cache:
        dm = instantiate(OmegaConf.create(data_cfg))
        dm.prepare_data()
        dm.setup("fit")
        cache[key] = dm
    dm = cache[key]
    if module.tokenizer is not None and dm.tokenizer.to_str() != module.tokenizer.to_str():
        raise ValueError(f"{run_dir}: the rebuilt data's tokenizer differs from the checkpoint's")
    return dm.collate([dm.val_dataset[i] for i in picked]), picked


def _checkpoint_of(row) -> Path | None:
    best = row["_best_model_path"]
    if not best:
        return None
    for path in (Path(best), Path(row["_dir"]) / "checkpoints" / Path(best).name):  # the sweep may have moved
        if path.is_file():
            return path
    return None


def ensure_key_aware(runs: pd.DataFrame, compute: bool = True) -> list[str]:
    """Write ``<run>/identifiability/key_aware.json`` for every run that lacks it; return notes on skipped runs."""
    notes, cache = [], {}
    for _, r in runs.iterrows():
        path = Path(r["_dir"]) / "identifiability" / "key_aware.json"
        if path.is_file():
            continue
        ckpt = _checkpoint_of(r)
        if not compute or ckpt is None or not (path.parent / "probe.json").is_file():
            why = "--no-key-aware" if not compute else "no best checkpoint" if ckpt is None else "no probe.json"
            notes.append(f"{r['run']}: no key_aware.json ({why})")
            continue
        from .lit_module import TextClassifier

        module = TextClassifier.load_from_checkpoint(str(ckpt), map_location="cpu")
        batch, picked = _probe_batch(Path(r["_dir"]), module, cache=cache)
        counts = key_aware_counts(module.model, batch["input_ids"], batch["attention_mask"].bool())
        path.write_text(json.dumps({"checkpoint": str(ckpt), "split": "validation", "indices": picked, **counts}))
        print(f"key-aware count: {r['run']} ({ckpt.name}, probe examples {picked})", flush=True)
    return notes


def key_aware_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Per configuration and example length n: mean ± std over seeds (of the mean over layers and heads)."""
    rows = []
    for _, r in runs.iterrows():
        path = Path(r["_dir"]) / "identifiability" / "key_aware.json"
        if not path.is_file():
            continue
        ka = json.loads(path.read_text())
        for b, n in enumerate(ka["lengths"]):
            rows.append({**{k: r[k] for k in GROUP}, "seed": r["seed"], "n": int(n),
                         **{k: float(np.mean(ka[k][b])) for k in ("alternative_dim", "key_agnostic_dim", "tangent_dim")}})
    if not rows:
        return None
    per_run = pd.DataFrame(rows)
    table = per_run.groupby(GROUP + ["n"])[["alternative_dim", "key_agnostic_dim", "tangent_dim"]].agg(["mean", "std"])
    table.columns = [f"{c}_{stat}" for c, stat in table.columns]
    table["runs"] = per_run.groupby(GROUP + ["n"]).size()
    return table.reset_index()


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
    parser.add_argument("--no-key-aware", action="store_true",
                        help="do not compute missing identifiability/key_aware.json files (slow: dense Jacobians)")
    args = parser.parse_args(argv)
    out = args.out or args.sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(args.sweep_dir)
    table = summarise(runs)
    runs.drop(columns=["_dir", "_best_model_path"]).to_csv(out / "results.csv", index=False)
    (out / "results.md").write_text(to_markdown(table))
    written = [out / "results.md", out / "results.csv"]
    faith = faithfulness_table(runs)
    notes: list[str] = []
    if faith is not None:
        faith.to_csv(out / "faithfulness.csv", index=False)
        (out / "faithfulness.md").write_text(_markdown(faith, GROUP + ["explainer"]))
        agreement, notes = seed_agreement(runs)
        written += [out / "faithfulness.md", out / "faithfulness.csv"]
        if agreement is not None:
            agreement.to_csv(out / "seed_agreement.csv", index=False)
            (out / "seed_agreement.md").write_text(_markdown(agreement, GROUP + ["explainer"]))
            written += [out / "seed_agreement.md", out / "seed_agreement.csv"]
    notes += ensure_key_aware(runs, compute=not args.no_key_aware)
    ka = key_aware_table(runs)
    if ka is not None:
        ka.to_csv(out / "key_aware.csv", index=False)
        (out / "key_aware.md").write_text(_markdown(ka, GROUP + ["n"], digits=1))
        written += [out / "key_aware.md", out / "key_aware.csv"]
    plots = plot(table, out)
    for note in notes:
        print(f"note: {note}")
    print(f"{len(runs)} runs, {len(table)} configurations -> {', '.join(str(p) for p in written)}, "
          f"{', '.join(p.name for p in plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
