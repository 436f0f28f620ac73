"""factorial.md and .csv: the factorial's contrasts (report/factorial.py) as tables, with the notes issue 41 asks for:
per-key-size results outside their margin where the pooled one is within, metrics without head-room for their
margin, and the adversarial TV's ceiling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..common.files import atomic_write
from .code_note import code_note
from .designs import equivalence_margins
from .factorial import (
    CELLS,
    factorial_table,
    head_room,
    in_factorial,
    is_rank_arm,
    per_key_outside,
    range_superiority,
    rank_table,
    tv_ceiling,
)


def _f(x: float) -> str:
    return f"{x:+.3f}"


def _what(r: pd.Series) -> str:
    return r["metric"] if r["explainer"] == "-" else f"{r['explainer']} {r['metric']}"


FACTORIAL_CELLS = tuple(f"{c}_{v}" for c, v in CELLS)
KEYS = ("data", "key_dim", "explainer", "metric", "contrast")


def _contrast_lines(table: pd.DataFrame, margins: dict[str, float], keys: tuple[str, ...] = KEYS,
                    cells: tuple[str, ...] = FACTORIAL_CELLS) -> list[str]:
    """The contrast rows: their ``keys``, the cell means (``cells``: columns of ``table``), estimate, CI and p, and
    with ``margins`` the TOST."""
    head = ("| " + " | ".join([*keys, *(c.replace("_", " ") for c in cells)]) + " | estimate | 95% CI | p |"
            + (" margin | 90% CI | TOST p |" if margins else "") + " runs |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for _, r in table.iterrows():
        line = ("| " + " | ".join(str(r[k]) for k in keys) + " | "
                + " | ".join(f"{r[c]:.3f}" for c in cells)
                + f" | {_f(r['estimate'])} | [{_f(r['ci95_low'])}, {_f(r['ci95_high'])}] | {r['p']:.3g} |")
        if margins:
            line += (f" {r['margin']:g} | [{_f(r['ci90_low'])}, {_f(r['ci90_high'])}] | {r['tost_p']:.3g} |"
                     if np.isfinite(r["margin"]) else " - | - | - |")
        lines.append(line + f" {r['runs']} |")
    return lines


def factorial_markdown(table: pd.DataFrame, ranges: pd.DataFrame | None, outside: pd.DataFrame,
                       room: pd.DataFrame, ceiling: bool, margins: dict[str, float]) -> str:
    tost = (" TOST (two one-sided Welch-Satterthwaite t-tests) at the margins fixed in the sweep preset before the "
            f"runs ({', '.join(f'{k} ±{v:g}' for k, v in sorted(margins.items()))}): equivalent at 5% when TOST p < "
            "0.05, i.e. the 90% CI inside ± the margin." if margins else " No margins in the runs' configs: no TOST.")
    lines = ["# The factorial: head combination x value size", "",
             "Cells: concat/add x value size S (the smaller value_dim: non-identifiable at these lengths) and L (the "
             "larger: identifiable); mean over seeds. Contrasts of the cell means: `value_size` (identifiability's "
             "main effect, L minus S averaged over the head combinations), `head_combine` (add minus concat averaged "
             "over the value sizes) and `interaction` ((add L - add S) - (concat L - concat S)), each with its "
             "Welch-Satterthwaite 95% CI and two-sided p (unequal cell variances). key_dim `all`: every key size "
             "pooled, each run one sample; then each key size. Runs: concat S / concat L / add S / add L." + tost, ""]
    lines += _contrast_lines(table, margins)
    lines += ["", "## Per key size outside its margin where the pooled contrast is within", ""]
    if outside.empty:
        lines.append("None: wherever the pooled contrast is equivalent within its margin, every key size is too.")
    else:
        for _, r in outside.iterrows():
            where = "the estimate itself lies outside" if abs(r["estimate"]) >= r["margin"] else "the estimate is " \
                "inside but its 90% CI is not"
            lines.append(f"* {r['data']}, key_dim {r['key_dim']}, {_what(r)}, {r['contrast']}: "
                         f"{_f(r['estimate'])}, 90% CI [{_f(r['ci90_low'])}, {_f(r['ci90_high'])}] against "
                         f"±{r['margin']:g} (TOST p {r['tost_p']:.3g}; {where}).")
    lines += ["", "## Head-room", "",
              "The best arm's mean and its distance to the metric's bound (1; for sufficiency the lowest mean any "
              "explainer reached on that data). Where the head-room is smaller than the margin, no arm can exceed "
              "another by the margin in that direction, so equivalence there is nearly guaranteed: **flagged**.", ""]
    flagged = room[room["flag"]]
    lines += ([f"* **{r['data']}, {_what(r)}**: best arm {r['best_arm']:.3f}, head-room "
               f"{r['head_room']:.3f} < margin {r['margin']:g}." for _, r in flagged.iterrows()]
              or ["No metric's head-room is smaller than its margin."])
    if ceiling:
        lines += ["", "**The adversarial TV is a ceiling**: every run's is 1.000 (to three decimals), so its contrasts "
                      "cannot tell the arms apart."]
    if ranges is not None:
        lines += ["", "## Equivalence-range spreads: superiority", "",
                  "Non-identifiable arms (value size S) minus identifiable ones (L), averaged over the head "
                  "combinations; one-sided Welch-Satterthwaite test of \"the non-identifiable arms' spreads are "
                  "larger\" (p < 0.05: shown larger).", "",
                  "| data | key_dim | range | non-identifiable | identifiable | difference | one-sided 95% low | p | "
                  "runs |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['data']} | {r['key_dim']} | {r['range']} | {r['non_identifiable']:.4f} | "
                  f"{r['identifiable']:.4f} | {_f(r['difference'])} | {_f(r['ci95_one_sided_low'])} | "
                  f"{r['p_superiority']:.3g} | {r['runs']} |" for _, r in ranges.iterrows()]
    return "\n".join(lines) + "\n"


def rank_markdown(table: pd.DataFrame, margins: dict[str, float]) -> list[str]:
    """factorial.md's section on the capped-rank arm (report/factorial.py's rank_table)."""
    lines = ["", "## The capped-rank arm: output rank against head combination", "",
             "The arm is concat at value size S with its output projection capped at rank r (`model.out_rank`; "
             "`concat_r<r>`), so its attention output has add S's rank and its heads concat S's. Contrasts: "
             "`rank_cap` (capped - concat S: the cap alone), `head_combine_at_rank` (add S - capped: the head "
             "combination at matched value size and output rank), `interaction_at_rank` ((add L - add S) - (concat L "
             "- capped): the factorial's interaction with the capped arm in concat S's place, both small-value arms at "
             "rank S, both large-value arms at rank d). Welch-Satterthwaite CIs and TOST as above. Runs: concat S / "
             "concat L / add S / add L / capped.", ""]
    return lines + _contrast_lines(table, margins, ("data", "key_dim", "arm", "explainer", "metric", "contrast"),
                                   (*FACTORIAL_CELLS, "capped"))


def write_factorial(runs: pd.DataFrame, out: Path) -> list[Path]:
    """``factorial.md`` and ``factorial.csv`` (the contrasts; the range superiority tests go to
    ``factorial_ranges.csv``) when the runs are a factorial; returns the files written."""
    cells = runs[in_factorial(runs)]  # the others: named by the caller (factorial.left_out_of_factorial)
    margins = equivalence_margins(cells)
    table = factorial_table(cells, margins)
    if table is None:
        return []
    capped = rank_table(runs, margins)
    ranges = range_superiority(cells)
    written = [out / "factorial.md", out / "factorial.csv"]
    atomic_write(out / "factorial.csv", table.to_csv(index=False))
    if capped is not None:
        atomic_write(out / "factorial_rank.csv", capped.to_csv(index=False))
        written.append(out / "factorial_rank.csv")
    if ranges is not None:
        atomic_write(out / "factorial_ranges.csv", ranges.to_csv(index=False))
        written.append(out / "factorial_ranges.csv")
    md = factorial_markdown(table, ranges, per_key_outside(table), head_room(table, cells), tv_ceiling(cells), margins)
    noted = cells  # the runs whose code the note names: the capped arm's too where it has a section
    if capped is not None:
        md += "\n".join(rank_markdown(capped, margins)) + "\n"
        noted = runs[in_factorial(runs) | is_rank_arm(runs)]
    atomic_write(out / "factorial.md", md + "\n" + code_note(noted) + "\n")
    return written
