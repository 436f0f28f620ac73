"""An example's layer x head overview: one linked cell per head coloured by a measure, per-layer totals, the measure
picker and the (script-filled) head detail below it.

The cells are written into the page, coloured by the first measure (null dim), so the overview reads without the
script; the script (assets.py) recolours them by the measure picked and draws a head's maps when its cell's fragment
(``#ex{b}-l{l}-h{h}``) is followed.
"""

from __future__ import annotations

import html
import json
from typing import Any

from .assets import colour, legend_gradient

__all__ = ["data_script", "detail_html", "overview_html"]


def _fmt(v: float | int | None, integer: bool) -> str:
    """As the script's fmt: an integer as is, a float to 2 decimals without the leading 0 (1 decimal from 1)."""
    if v is None:
        return "–"
    if integer:
        return str(int(v))
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.1f}"
    s = f"{v:.2f}"
    return s.replace("0.", ".", 1) if s.lstrip("-").startswith("0.") else s


def data_script(data: dict[str, Any]) -> str:
    """The example's JSON record (head_data.example_data) in a script element the page's script reads."""
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")  # no "</script>" inside
    return f"<script type='application/json' id='ex{data['example']}-data'>{text}</script>"


def overview_html(data: dict[str, Any], not_identifiable: list[int]) -> str:
    """The overview table of one example: ``not_identifiable[l]`` heads of layer l have stochastic null dim > 0."""
    b, L, H = data["example"], data["layers"], data["heads"]
    first = data["measures"][0]
    seen = [v for row in first["values"] for v in row if v is not None]
    top = max([1e-12, *seen])
    options = "".join(f"<option value='{html.escape(m['key'])}'>{html.escape(m['label'])}</option>"
                      for m in data["measures"])
    head = ("<tr><th></th>" + "".join(f"<th>H{h}</th>" for h in range(H))
            + f"<th class='tot'>not ident.</th><th class='mean'>mean {html.escape(first['label'])}</th></tr>")
    rows = []
    for l in range(L):
        cells = []
        for h in range(H):
            v = first["values"][l][h]
            bg, ink = ("rgb(221,221,221)", "#000") if v is None else colour(v / top)
            text = _fmt(v, first["int"])
            cells.append(f"<td><a class='cell' data-layer='{l}' data-head='{h}' href='#ex{b}-l{l}-h{h}' "
                         f"title='layer {l}, head {h}: {html.escape(first['label'])} {text}' "
                         f"style='background:{bg};color:{ink}'>{text}</a></td>")
        vs = [v for v in first["values"][l] if v is not None]
        mean = _fmt(sum(vs) / len(vs), False) if vs else "–"
        rows.append(f"<tr><th class='lay'>L{l}</th>{''.join(cells)}<td class='tot' data-layer='{l}'>"
                    f"{not_identifiable[l]}/{H}</td><td class='mean' data-layer='{l}'>{mean}</td></tr>")
    bar = (f"<div class='ovbar'>Colour by <select class='measure' data-example='{b}'>{options}</select>"
           f"<span class='legend'><span class='name'>{html.escape(first['label'])}</span>: 0<span class='bar' "
           f"style='background:{legend_gradient()}'></span><span class='hi'>{_fmt(top if seen else None, first['int'])}"
           "</span></span> <span class='hint'>one cell per head (rows: layers, columns: heads); click one for its "
           "maps</span></div>")
    return (f"<div class='overview' data-example='{b}' data-layers='{L}' data-heads='{H}'>{bar}"
            f"<table class='ov'>{head}{''.join(rows)}</table></div>")


def detail_html(b: int, below: str = "") -> str:
    """The head detail of example ``b`` (filled by the script) with ``below`` (the explainers' strips) under it."""
    return (f"<div class='detail' id='ex{b}-detail'><div class='head-detail'><p class='hint'>Pick a head in the "
            f"overview (or open <code>#ex{b}-l0-h0</code>) for its raw, effective and witness maps.</p></div>"
            f"{below}</div>")
