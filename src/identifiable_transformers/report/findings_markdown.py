"""findings.md and findings.csv beside a study's tables: the verdicts of :mod:`.findings`, each with its numbers, and
next to a verdict that could not have failed, why. docs/results.md quotes findings.md verbatim (:mod:`.docs`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..common.files import atomic_write
from .code_note import code_note
from .designs import equivalence_margins
from .factorial import RANK_CONTRASTS
from .findings import findings

HEADER = ("| task | key_dim | explainer | metric | contrast | estimate | 95% CI | p | margin | 90% CI | TOST p "
          "| verdict | runs |")
WHAT = {
    "factorial": "The factorial's contrasts of the four cell means (factorial.md: `value_size` L minus S, "
                 "`head_combine` add minus concat, `interaction`), and the equivalence-range spreads of the "
                 "non-identifiable arms minus the identifiable ones (`S - L`, two-sided here).",
    "designs": "Identifiable (add) minus baseline (concat), from faithfulness_designs.md's Welch tests and TOST.",
    "explainers": "One configuration: each explainer minus raw attention on the same runs (paired t-test over the "
                  "runs), and the identifiable fraction's level.",
}
RANK = ("The capped-rank arm (`concat_r<r>`: concat at the small value size, output projection capped at rank r; "
        "factorial.md's last section) against the cells at its key size: `rank_cap` (capped minus concat S), "
        "`head_combine_at_rank` (add S minus capped) and `interaction_at_rank` (the interaction with the capped arm "
        "in concat S's place).")
RULE = ("Verdict rule: `equivalent` when the TOST p < 0.05 at the margin fixed in the sweep preset before the runs "
        "(the 90% CI inside ± the margin); else `differs` when the 95% CI excludes 0; else `not shown`. "
        "*could not fail*: an arm with zero variance, no head-room for the margin, a ceiling, or an identifiability "
        "fraction set by probes all beyond or all within the identifiable length.")


def _f(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:+.3f}"


def _p(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:.2g}"


def _line(r: pd.Series) -> str:
    ci90 = f"[{_f(r['ci90_low'])}, {_f(r['ci90_high'])}]" if np.isfinite(r["margin"]) else "-"
    margin = f"±{r['margin']:g}" if np.isfinite(r["margin"]) else "-"
    said = r["verdict"] if r["could_fail"] else f"{r['verdict']} (*could not fail*: {r['why_not']})"
    return (f"| {r['task']} | {r['key_dim']} | {r['explainer']} | {r['metric']} | {r['contrast']} | "
            f"{_f(r['estimate'])} | [{_f(r['ci95_low'])}, {_f(r['ci95_high'])}] | {_p(r['p'])} | {margin} | {ci90} | "
            f"{_p(r['tost_p'])} | {said} | {r['runs']} |")


def findings_markdown(kind: str, table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Every key-sizes-pooled row (key_dim ``all``), then the per-key-size rows whose verdict differs from their
    pooled row's (findings.csv holds them all, and the equivalence ranges per length bin)."""
    table = table.assign(key_dim=table["key_dim"].astype(str))
    table = table[~table["metric"].str.contains("/len_le_")]  # the ranges per length bin: in findings.csv
    keys = ["task", "explainer", "metric", "contrast"]
    has_pooled = set(map(tuple, table.loc[table["key_dim"] == "all", keys].to_numpy()))
    alone = np.array([tuple(k) not in has_pooled for k in table[keys].to_numpy()], bool)  # run at one key size
    pooled = table[(table["key_dim"] == "all").to_numpy() | alone]
    said = pooled.set_index(keys)["verdict"]
    per = table[(table["key_dim"] != "all").to_numpy() & ~alone]
    changed = per[[said.get(tuple(r[k] for k in keys)) != r["verdict"] for _, r in per.iterrows()]]
    counts = pooled["verdict"].value_counts()
    ranked = pooled["contrast"].str.split(" (", regex=False).str[0].isin(list(RANK_CONTRASTS))  # _rank_rows' names
    what = WHAT[kind] + (" " + RANK if ranked.any() else "")
    lines = ["**Findings generated from the statistics** (`findings.md`, one row per task, explainer, metric and "
             "contrast; every number and verdict in `findings.csv`). " + what + " " + RULE, "",
             ("Key sizes pooled (and the contrasts run at one key size only)" if alone.any() else "Key sizes pooled")
             + ": " + ", ".join(f"{counts.get(v, 0)} {v}" for v in ("equivalent", "differs", "not shown"))
             + f"; {int((~pooled['could_fail']).sum())} of them could not fail.", "", HEADER,
             "|" + "---|" * (HEADER.count("|") - 1)]
    lines += [_line(r) for _, r in pooled.iterrows()]
    if not per.empty:
        lines += ["", "Per key size, where the verdict differs from the pooled one "
                      f"({len(changed)} of {len(per)} rows; findings.csv holds them all):", ""]
        lines += [HEADER, "|" + "---|" * (HEADER.count("|") - 1), *(_line(r) for _, r in changed.iterrows())] \
            if not changed.empty else ["None."]
    return "\n".join(lines) + "\n\n" + code_note(runs) + "\n"


def write_findings(runs: pd.DataFrame, out: Path) -> list[Path]:
    """``findings.csv`` and ``findings.md`` when the runs compare arms (or explainers); returns the files written."""
    found = findings(runs, equivalence_margins(runs))
    if found is None:
        return []
    kind, table = found
    atomic_write(out / "findings.csv", table.to_csv(index=False))
    atomic_write(out / "findings.md", findings_markdown(kind, table, runs))
    return [out / "findings.md", out / "findings.csv"]
