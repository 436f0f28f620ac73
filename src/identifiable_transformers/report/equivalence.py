"""The equivalence-range table: how far each configuration's explanations can move at a fixed output
(docs/identifiability.md 2.8, docs/diagnostics.md "Equivalence ranges"), mean ± std over seeds.

The ``EquivalenceCallback`` logs ``val/ident/range_*`` every epoch; a run's ``metrics.json`` holds the last epoch's.
"""

from __future__ import annotations

import pandas as pd

from .runs import GROUP

# column -> key (``val/`` dropped) in the runs table, in the table's order
RANGE_COLUMNS = {
    "free_frac": "ident/range_free_frac",
    "top": "ident/range_top",
    "rationale": "ident/range_rationale",
    "loo": "ident/range_loo",
    "mean_rationale_low": "ident/range_headmean/rationale_low",
    "mean_rationale_high": "ident/range_headmean/rationale_high",
    "mean_top_low": "ident/range_headmean/mean_top_low",
    "mean_top_high": "ident/range_headmean/mean_top_high",
    "comp_worst": "ident/range_comprehensiveness_worst",
    "comp_best": "ident/range_comprehensiveness_best",
    "auprc_worst": "ident/range_rationale_auprc_worst",
    "auprc_best": "ident/range_rationale_auprc_best",
}


def equivalence_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Mean ± std over seeds per configuration of the range metrics the runs logged; None when none did.

    ``free_frac``: the share of head rows whose class is more than a point; ``top``, ``rationale``, ``loo``: the mean
    spread (greatest - least) of a head row's top-token weight, rationale weight and loo agreement; ``mean_*_low`` /
    ``_high``: the head-mean explanation's least and greatest value; ``comp_``/``auprc_worst``/``_best``: the
    comprehensiveness and rationale AUPRC of the worst and the best equivalent explanation.
    """
    present = {name: key for name, key in RANGE_COLUMNS.items() if key in runs and runs[key].notna().any()}
    if not present:
        return None
    rows = []
    for keys, g in runs.groupby(GROUP):
        row = {**dict(zip(GROUP, keys))}
        n = 0
        for name, key in present.items():
            vals = g[key].dropna()
            row[f"{name}_mean"], row[f"{name}_std"] = vals.mean(), vals.std()
            n = max(n, len(vals))
        row["runs"] = n
        rows.append(row)
    return pd.DataFrame(rows)
