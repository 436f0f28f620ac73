"""The per-length table: identifiability and faithfulness per cumulative length bin, mean ± std over seeds.

The callbacks log every per-epoch metric also per bin of the probe (``val/ident/len_le_<N>/<metric>`` and
``val/faith/<explainer>/len_le_<N>/<metric>``: the probe examples of at most N tokens, docs/diagnostics.md). This
table answers "how identifiable, and how faithful, at which length" for each configuration of a sweep: one row per
configuration and bin, from the shortest bin to the longest.
"""

from __future__ import annotations

import re

import pandas as pd

from .runs import GROUP

# The identifiability columns of the table (a bin's probe_count first: how many probe examples it holds).
IDENT_METRICS = ("probe_count", "identifiable_frac", "null_dim", "alt_tv", "eps_tv_1e-3", "effective_gap",
                 "range_top", "range_rationale")  # the last two: equivalence ranges, where a run logged them
# The explainers and metrics of the table: raw and effective attention, where the designs differ.
LENGTH_EXPLAINERS = ("attention", "effective")
LENGTH_FAITH_METRICS = ("comprehensiveness", "sufficiency", "rationale_auprc")
_BIN = re.compile(r"^(?:ident|faith/[a-z_]+)/len_le_(\d+)/")


def length_bins(runs: pd.DataFrame) -> list[int]:
    """The bins' upper lengths that any run logged, shortest first."""
    return sorted({int(m.group(1)) for c in runs.columns if (m := _BIN.match(c))})


def length_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Mean ± std over seeds per configuration and length bin; None when no run logged a per-bin metric.

    Columns: the configuration (``GROUP``), ``length_le`` (the bin: probe examples of at most that many tokens),
    then ``<metric>_mean``/``_std`` for ``IDENT_METRICS`` and ``<explainer>_<metric>`` for the explainers and
    metrics of ``LENGTH_EXPLAINERS`` x ``LENGTH_FAITH_METRICS`` that the runs logged. A metric a run did not log in
    a bin (faithfulness stops at ``callbacks.faithfulness.max_length``) is left out of that bin's mean; a bin no
    run of a configuration logged is left out of the table.
    """
    bins = length_bins(runs)
    if not bins:
        return None
    columns = {m: f"ident/len_le_{{n}}/{m}" for m in IDENT_METRICS}
    columns |= {f"{e}_{m}": f"faith/{e}/len_le_{{n}}/{m}" for e in LENGTH_EXPLAINERS for m in LENGTH_FAITH_METRICS}
    present = [name for name, key in columns.items() if any(key.format(n=n) in runs for n in bins)]
    rows = []
    for keys, g in runs.groupby(GROUP):
        for n in bins:
            row = {**dict(zip(GROUP, keys)), "length_le": n}
            logged = 0
            for name in present:
                key = columns[name].format(n=n)
                vals = g[key].dropna() if key in g else pd.Series(dtype=float)
                row[f"{name}_mean"], row[f"{name}_std"] = vals.mean(), vals.std()
                logged = max(logged, len(vals))
            if logged:
                row["runs"] = logged
                rows.append(row)
    return pd.DataFrame(rows) if rows else None
