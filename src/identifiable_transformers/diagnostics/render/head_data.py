"""One example's per-head data for the report's overview and on-demand head detail, embedded in the page as JSON.

The page holds data, not pictures: each head's raw, effective and witness maps block-averaged to at most
``MAX_SIDE`` cells a side (``plots.block_mean``), quantised to uint8 against the head's own scale and base64-encoded,
so an example costs about L * H * 3 * MAX_SIDE² bytes (x 4/3) whatever its length, and the browser draws them on
demand (assets.py). The witness of an identifiable head (stochastic_null_dim == 0) is the map itself: not embedded.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .plots import block_mean

__all__ = ["LABELLED_TOKENS", "MAX_SIDE", "MEASURES", "example_data", "measures_of", "quantise"]

MAX_SIDE = 64  # cells per side of an embedded map: 64 x 64 x 3 bytes per head at most
LABELLED_TOKENS = 40  # a map of at most this many tokens is drawn with its token labels; longer ones have tooltips

# (report key, label, integer?) of the measures the overview can colour by, in the picker's order, the first one shown
# first; a key missing from the identifiability output (eps_* of an older report) is left out. Witness TV leads: a
# generic head's null dim is max(0, n - d_v) in every head of an example (docs/identifiability.md 2.1), one colour.
MEASURES = (
    ("alt_attention_tv", "witness TV", False),
    ("null_dim", "null dim", True),
    ("stochastic_null_dim", "stoch. null dim", True),
    ("effective_gap", "eff. gap", False),
    ("eps_tv_1e-3", "ε-TV (ε = 1e-3)", False),
    ("eps_tv_1e-2", "ε-TV (ε = 1e-2)", False),
)
# shown in the head detail's header besides the measures
_STATS = (("witness_rel_error", "rel. err. A'T vs AT"), ("sigma_ratio", "σmin/σmax"),
          ("attention_entropy", "entropy"))


def quantise(x: np.ndarray, top: float, signed: bool = False) -> str:
    """``x`` as base64 uint8: round(255 x / top) in [0, 255], or for ``signed`` maps 127.5 (1 + x / top)."""
    top = max(float(top), 1e-30)
    q = 127.5 * (1 + x / top) if signed else 255 * x / top
    return base64.b64encode(np.clip(np.rint(q), 0, 255).astype(np.uint8).tobytes()).decode("ascii")


def _finite(x: float, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits (what a cell or a header shows; the full values are in report.json),
    None if it is not finite."""
    return float(f"{float(x):.{digits}g}") if math.isfinite(float(x)) else None


def measures_of(rep: dict[str, Any], b: int) -> list[dict[str, Any]]:
    """The overview's measures of example ``b``: key, label, integer?, values [L][H] (None where undefined)."""
    out = []
    for key, label, integer in MEASURES:
        if key not in rep:
            continue
        v = rep[key][b]
        values = v.long().tolist() if integer else [[_finite(x) for x in row] for row in v.double().tolist()]
        out.append({"key": key, "label": label, "int": integer, "values": values})
    return out


def example_data(rep: dict[str, Any], b: int, tokens: Sequence[str]) -> dict[str, Any]:
    """Example ``b`` of an ``attention_identifiability(..., return_maps=True)`` report as the page's JSON record.

    ``maps`` holds per head (layer-major) the quantised raw ("a"), effective ("e") and witness ("w", None for an
    identifiable head) maps at ``side`` x ``side`` cells of ``block`` x ``block`` tokens, their scales ("top": raw and
    witness share it, "etop": max |A_eff|), and the full-length row of token 0 of the raw and witness maps ("r0",
    "w0", scaled to "rtop")."""
    n = int(rep["lengths"][b])
    m = rep["maps"][b]
    A, E, W = (m[k].double().numpy() for k in ("attention", "effective", "alternative"))  # [L, H, n, n]
    L, H = A.shape[:2]
    stoch = rep["stochastic_null_dim"][b]
    a_small, block = block_mean(A, MAX_SIDE)
    e_small, _ = block_mean(E, MAX_SIDE)
    w_small, _ = block_mean(W, MAX_SIDE)
    heads = []
    for l in range(L):
        for h in range(H):
            ident = int(stoch[l, h]) == 0
            top = float(a_small[l, h].max()) if ident else float(max(a_small[l, h].max(), w_small[l, h].max()))
            etop = float(np.abs(e_small[l, h]).max())
            rtop = float(A[l, h, 0].max()) if ident else float(max(A[l, h, 0].max(), W[l, h, 0].max()))
            heads.append({
                "top": top, "etop": etop, "rtop": rtop,
                "a": quantise(a_small[l, h], top), "e": quantise(e_small[l, h], etop, signed=True),
                "w": None if ident else quantise(w_small[l, h], top),
                "r0": quantise(A[l, h, 0], rtop), "w0": None if ident else quantise(W[l, h, 0], rtop),
                "stats": {k: _finite(rep[k][b, l, h]) for k, _ in _STATS if k in rep},
            })
    return {"example": b, "n": n, "layers": L, "heads": H, "block": block, "side": a_small.shape[-1],
            "labelled": n <= LABELLED_TOKENS, "tokens": [str(t) for t in list(tokens)[:n]],
            "measures": measures_of(rep, b), "stat_labels": dict(_STATS), "maps": heads}


def layer_totals(stochastic_null_dim: torch.Tensor) -> list[int]:
    """Per layer, how many heads are not identifiable (stochastic null dim > 0) on this example."""
    return (stochastic_null_dim > 0).sum(-1).tolist()
