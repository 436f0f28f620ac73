"""The report's faithfulness and plausibility tables: every explainer's metrics per cumulative length bin.

A bin B holds the report's examples of at most B real tokens (``<cls>`` included), as the per-epoch callbacks'
``len_le_B`` bins do (docs/diagnostics.md), so the last bin is every example. A cell is the mean over the bin's
examples of the per-example metric of ``faithfulness_report`` (NaN entries, e.g. tau_loo below 3 tokens, left
out); ``None`` when none of them has one.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import torch

FAITHFULNESS_COLUMNS = (("comprehensiveness", "compr. ↑"), ("sufficiency", "suff. ↓"), ("tau_loo", "τ with loo ↑"),
                        ("flip_frac", "flip frac. ↓"))
PLAUSIBILITY_COLUMNS = (("rationale_auprc", "AUPRC rat. ↑"), ("rationale_f1", "F1 rat. ↑"))


def faithfulness_by_length(per_example: dict[str, torch.Tensor], explainers: Sequence[str], lengths: Sequence[int],
                           bins: Sequence[int]) -> list[dict]:
    """One row per (bin, explainer): ``length_le``, ``examples`` (in the bin), ``explainer`` and every metric of
    ``per_example`` ({"<explainer>/<metric>": (B,)}) averaged over the bin's examples."""
    lengths_t = torch.as_tensor(list(lengths))
    metrics = [m for m, _ in FAITHFULNESS_COLUMNS + PLAUSIBILITY_COLUMNS]
    rows = []
    for b in sorted(set(int(x) for x in bins)):
        in_bin = lengths_t <= b
        if not bool(in_bin.any()):
            continue
        for e in explainers:
            row: dict = {"length_le": b, "examples": int(in_bin.sum()), "explainer": e}
            for m in metrics:
                key = f"{e}/{m}"
                if key not in per_example:
                    continue
                x = per_example[key].detach().double().cpu()[in_bin]
                x = x[~torch.isnan(x)]
                row[m] = float(x.mean()) if len(x) else None
            rows.append(row)
    return rows


def _cell(v) -> str:
    return "<td>n/a</td>" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"<td>{v:.3f}</td>"


def tables_html(rows: list[dict]) -> str:
    """The faithfulness table and, where the rows carry rationale metrics, the plausibility table."""
    parts = []
    for title, columns in (("Faithfulness", FAITHFULNESS_COLUMNS), ("Plausibility", PLAUSIBILITY_COLUMNS)):
        shown = [(m, label) for m, label in columns if any(m in r for r in rows)]
        if not shown:
            continue
        head = ("<tr><th>tokens ≤</th><th>examples</th><th class='l'>explainer</th>"
                + "".join(f"<th>{label}</th>" for _, label in shown) + "</tr>")
        body = "".join(f"<tr><td>{r['length_le']}</td><td>{r['examples']}</td><th class='l'>"
                       f"{html.escape(r['explainer'])}</th>" + "".join(_cell(r.get(m)) for m, _ in shown) + "</tr>"
                       for r in rows)
        parts.append(f"<h3>{title} per length bin</h3><table class='{title.lower()}'>{head}{body}</table>")
    return "".join(parts)
