"""The report's equivalence-class section: per example and head, how far the ``<cls>`` row's top-token weight,
rationale weight and loo agreement can move at a fixed output (docs/identifiability.md 2.8)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import torch

from ..faithfulness.equivalent import equivalent_explanations

_LABELS = {"top": "top-token weight", "mean_top": "head-mean top token's weight", "loo": "agreement Σ a'·loo",
           "rationale": "rationale weight"}


def _cell(low: float, value: float, high: float) -> str:
    if math.isnan(value):
        return "–"
    spread = high - low
    return f"{value:.3f} <span class='{'bad' if spread > 1e-6 else 'ok'}'>[{low:.3f}, {high:.3f}]</span>"


def equivalence_section(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        tokens: Sequence[Sequence[str]], rationale_mask: torch.Tensor | None = None,
                        loo: torch.Tensor | None = None, flip_resolution: int | None = None
                        ) -> tuple[list[str], list[dict[str, Any]]]:
    """HTML parts (one table per example) and report.json records: per example and head of the last layer, each
    objective's [low, value, high] over the row's output-equivalent rows, and the best and worst equivalent
    explanation's comprehensiveness (and rationale AUPRC). Nothing (two empty lists) for pooling other than cls.
    ``loo`` (B, T): the leave-one-out scores the faithfulness pass already computed (else computed again);
    ``flip_resolution``: the extremes' removal curves on that grid (faithfulness/erasure.py; None: every removal)."""
    if getattr(model, "pooling", "cls") != "cls":
        return [], []
    rep = equivalent_explanations(model, input_ids, attention_mask, rationale_mask=rationale_mask, loo=loo,
                                  flip_resolution=flip_resolution)
    names, H = rep["objectives"], rep["low"].shape[1]
    parts = ["<h2>Output-equivalent explanations</h2><p>For each head's <code>&lt;cls&gt;</code> row a of the last "
             "layer: its value and, in brackets, the least and greatest value over every row a' ≥ 0, Σa' = 1 with "
             "the same head output a'T = aT (linear programs; docs/identifiability.md §2.8). <i>free dim</i> = "
             "n − rank([T, 1]): 0 means the row is identifiable and every range is a point. The head-mean row is "
             f"the attention explanation; <i>best</i>/<i>worst</i> maximise/minimise the {rep['guide']} objective "
             "in every head.</p>"]
    records = []
    for b in range(rep["low"].shape[0]):
        n = int(rep["lengths"][b])
        cols = ["head", "free dim", "top token", *(_LABELS[o] for o in names if o != "mean_top")]
        rows = []
        for h in range(H):
            bounds = {o: [float(rep[k][b, h, j]) for k in ("low", "value", "high")] for j, o in enumerate(names)}
            records.append({"example": b, "layer": rep["layer"], "head": h, "length": n,
                            "top_token": _top_token(rep, b, h, tokens[b]),
                            "free_dim": int(rep["free_dim"][b, h]),
                            "ranges": {o: [None if math.isnan(x) else x for x in v] for o, v in bounds.items()}})
            cells = [h, int(rep["free_dim"][b, h]), html.escape(records[-1]["top_token"]),
                     *(_cell(*bounds[o]) for o in names if o != "mean_top")]
            rows.append(cells)
        mean = {o: [float(rep[k][b, :, j].mean()) for k in ("low", "value", "high")] for j, o in enumerate(names)}
        rows.append(["mean", "", "", *(_cell(*mean["mean_top" if o == "top" else o]) for o in names
                                         if o != "mean_top")])
        extremes = {k: float(v[b]) for k, v in rep["per_example"].items()
                    if k.endswith(("/comprehensiveness", "/rationale_auprc"))}
        records.append({"example": b, "head": "mean", "length": n,
                        "ranges": {o: [None if math.isnan(x) else x for x in v] for o, v in mean.items()},
                        "extremes": {k: None if math.isnan(v) else v for k, v in extremes.items()}})
        parts.append(f"<h3>Example {b} — n = {n}</h3><table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
                     + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows) + "</table>"
                     + "<p>" + ", ".join(f"{k}: {v:.3f}" for k, v in extremes.items()) + "</p>")
    return parts, records


def _top_token(rep: dict[str, Any], b: int, h: int, tokens: Sequence[str]) -> str:
    """The token whose weight the ``top`` objective tracks: the row's own top token (value = its weight)."""
    return str(list(tokens)[int(rep["top_index"][b, h])])
