"""The report page's stylesheet and script, inlined into report.html (no network, no server).

The script recolours each example's layer x head overview by the measure picked, and draws one head's maps on
demand from the example's embedded JSON (head_data.py) when the URL fragment names it (``#ex0-l3-h5``; the overview's
cells are links to those fragments, so a head's view can be linked and bookmarked). It exposes
``window.identifiabilityReport`` ({show, decode}) for the browser test.
"""

from __future__ import annotations

import base64
from functools import cache

import numpy as np

__all__ = ["CSS", "colour", "legend_gradient", "script"]

CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}.ok{color:#17702a;font-weight:600}.bad{color:#b3261e;font-weight:600}
.text{background:#f7f7f7;padding:.6em;border-left:3px solid #999;white-space:pre-wrap;max-height:12em;overflow:auto}
img{max-width:100%;border:1px solid #ddd}code{background:#f3f3f3;padding:0 3px}
td.strip{text-align:left;line-height:1.9}.tok{display:inline-block;line-height:1.3;padding:1px 2px;margin:1px;
  border-radius:2px}
.rat{border-bottom:3px solid #222}
.overview{margin:.6em 0 .4em}.ovbar{margin:.3em 0;font-size:14px}.ovbar select{font-size:14px}
table.ov{border-collapse:separate;border-spacing:2px;margin:.2em 0}
table.ov td,table.ov th{border:none;padding:0;background:none;font-size:11px;text-align:center;font-weight:normal}
table.ov th.lay{padding-right:4px;text-align:right}
a.cell{display:block;width:36px;height:22px;line-height:22px;text-decoration:none;border-radius:2px;
  font-variant-numeric:tabular-nums}
a.cell:hover{outline:2px solid #888}a.cell.sel{outline:3px solid #e4572e;outline-offset:1px}
table.ov th.tot,table.ov th.mean{padding:0 8px}
table.ov td.tot,table.ov td.mean{padding:0 8px;color:#444;text-align:right;font-variant-numeric:tabular-nums}
.legend{margin-left:1em;color:#444}.legend .bar{display:inline-block;width:140px;height:10px;margin:0 4px;
  vertical-align:middle;border:1px solid #bbb}
.hint{color:#666;font-style:italic}
.head-detail{border-top:2px solid #e4572e;margin:.6em 0;padding-top:.3em}
.head-detail h3{margin:.2em 0}.stats{font-size:13px;color:#333}
.maps{display:flex;gap:18px;flex-wrap:wrap;align-items:flex-start}.maps figure{margin:0}
.maps canvas{display:block;image-rendering:pixelated;border:1px solid #ddd}
.maps figcaption{font-size:12px;margin-top:3px}.maps figcaption .bar{display:inline-block;width:80px;height:8px;
  margin:0 3px;vertical-align:middle;border:1px solid #bbb}
table.rows td.strip{max-width:900px}
details{margin:.5em 0}summary{cursor:pointer;color:#333}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;padding:2px 6px;font-size:12px;border-radius:3px;
  display:none;z-index:9;white-space:nowrap}
"""


@cache
def _lut(name: str) -> np.ndarray:
    """A matplotlib colormap as 256 x 3 uint8."""
    from matplotlib import colormaps

    return (colormaps[name](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)


def colour(t: float, name: str = "viridis") -> tuple[str, str]:
    """(background, text colour) of ``t`` in [0, 1] on ``name``, as the script computes them."""
    r, g, b = (int(x) for x in _lut(name)[int(round(255 * min(1.0, max(0.0, t))))])
    return f"rgb({r},{g},{b})", "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#fff"


def legend_gradient(name: str = "viridis", stops: int = 9) -> str:
    """A CSS linear-gradient of ``name``."""
    lut = _lut(name)
    cols = [lut[int(round(i * 255 / (stops - 1)))] for i in range(stops)]
    return "linear-gradient(to right," + ",".join(f"rgb({r},{g},{b})" for r, g, b in cols) + ")"


_JS = r"""
(() => {
"use strict";
const bytes = s => Uint8Array.from(atob(s), c => c.charCodeAt(0));
const LUT = {seq: bytes("__SEQ__"), div: bytes("__DIV__")};
const GRAD = {seq: "__GSEQ__", div: "__GDIV__"};
const cache = {};
const data = b => {
  if (!(b in cache)) {
    const el = document.getElementById(`ex${b}-data`);
    cache[b] = el ? JSON.parse(el.textContent) : null;
  }
  return cache[b];
};
const rgb = (lut, t) => {
  const i = 3 * Math.max(0, Math.min(255, Math.round(255 * t)));
  return [lut[i], lut[i + 1], lut[i + 2]];
};
const css = c => `rgb(${c[0]},${c[1]},${c[2]})`;
const ink = c => (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] > 140 ? "#000" : "#fff");
const fmt = (v, integer) => (v === null ? "–" : integer ? String(v)
  : Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(1) : v.toFixed(2).replace(/^(-?)0\./, "$1."));
const esc = s => s.replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const el = (tag, attrs = {}, text = null) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== null) e.textContent = text;
  return e;
};
const overview = b => document.querySelector(`.overview[data-example="${b}"]`);

function recolour(b) {
  const d = data(b), ov = overview(b);
  if (!d || !ov) return;
  const key = ov.querySelector("select.measure").value;
  const m = d.measures.find(x => x.key === key);
  const seen = m.values.flat().filter(v => v !== null);
  const top = Math.max(1e-12, ...seen);
  ov.querySelectorAll("a.cell").forEach(c => {
    const l = +c.dataset.layer, h = +c.dataset.head, v = m.values[l][h];
    const col = v === null ? [221, 221, 221] : rgb(LUT.seq, v / top);
    c.style.background = css(col);
    c.style.color = ink(col);
    c.textContent = fmt(v, m.int);
    c.title = `layer ${l}, head ${h}: ${m.label} ${fmt(v, m.int)}`;
  });
  ov.querySelectorAll("td.mean").forEach(td => {
    const vs = m.values[+td.dataset.layer].filter(v => v !== null);
    td.textContent = vs.length ? fmt(vs.reduce((a, x) => a + x, 0) / vs.length, false) : "–";
  });
  ov.querySelector("th.mean").textContent = `mean ${m.label}`;
  ov.querySelector(".legend .name").textContent = m.label;
  ov.querySelector(".legend .hi").textContent = fmt(seen.length ? top : null, m.int);
}

function decode(b, l, h, kind) {
  const d = data(b), hd = d.maps[l * d.heads + h], s = hd[kind];
  if (s === null) return null;
  const q = bytes(s), out = new Array(q.length);
  const top = kind === "e" ? hd.etop : kind === "r0" || kind === "w0" ? hd.rtop : hd.top;
  for (let i = 0; i < q.length; i++) out[i] = kind === "e" ? (q[i] / 127.5 - 1) * top : (q[i] / 255) * top;
  return out;
}

const tip = () => document.getElementById("tip") || document.body.appendChild(el("div", {id: "tip"}));
const clip = t => (t.length > 14 ? t.slice(0, 13) + "…" : t);

function span(d, i) {  // the tokens of map cell i (a block of d.block tokens)
  const lo = i * d.block, hi = Math.min(d.n, lo + d.block) - 1;
  return lo === hi ? `${lo} ${d.tokens[lo]}` : `${lo}–${hi} (${clip(d.tokens[lo])} … ${clip(d.tokens[hi])})`;
}

function drawMap(d, values, top, signed, kind, caption) {
  const side = d.side, labels = d.labelled;
  const cell = labels ? Math.max(8, Math.min(16, Math.floor(320 / side))) : Math.max(2, Math.floor(288 / side));
  const font = `${Math.min(11, cell)}px sans-serif`;  // a label no taller than its row
  const probe = document.createElement("canvas").getContext("2d");
  probe.font = font;
  const margin = labels ? Math.ceil(6 + Math.max(...d.tokens.map(t => probe.measureText(clip(t)).width))) : 0;
  const canvas = el("canvas", {"data-kind": kind, width: margin + side * cell, height: side * cell + margin});
  const ctx = canvas.getContext("2d"), lut = signed ? LUT.div : LUT.seq;
  for (let i = 0; i < side; i++) {
    for (let j = 0; j < side; j++) {
      const v = values[i * side + j];
      ctx.fillStyle = css(rgb(lut, signed ? 0.5 + 0.5 * v / top : v / top));
      ctx.fillRect(margin + j * cell, i * cell, cell, cell);
    }
  }
  if (labels) {
    ctx.font = font;
    ctx.fillStyle = "#222";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    d.tokens.forEach((t, i) => ctx.fillText(clip(t), margin - 3, i * cell + cell / 2));
    d.tokens.forEach((t, j) => {
      ctx.save();
      ctx.translate(margin + j * cell + cell / 2, side * cell + 3);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(clip(t), 0, 0);
      ctx.restore();
    });
  }
  canvas.addEventListener("mousemove", e => {
    const r = canvas.getBoundingClientRect(), s = canvas.width / r.width;
    const j = Math.floor(((e.clientX - r.left) * s - margin) / cell), i = Math.floor((e.clientY - r.top) * s / cell);
    const t = tip();
    if (i < 0 || j < 0 || i >= side || j >= side) { t.style.display = "none"; return; }
    t.textContent = `query ${span(d, i)} → key ${span(d, j)}: ${values[i * side + j].toPrecision(3)}`;
    t.style.left = `${e.clientX + 12}px`;
    t.style.top = `${e.clientY + 12}px`;
    t.style.display = "block";
  });
  canvas.addEventListener("mouseleave", () => { tip().style.display = "none"; });
  const fig = el("figure", {"data-kind": kind});
  fig.append(canvas);
  const cap = el("figcaption");
  cap.innerHTML = `<b>${esc(caption)}</b> ${signed ? fmt(-top, false) : "0"}<span class="bar" style="background:`
    + `${signed ? GRAD.div : GRAD.seq}"></span>${fmt(top, false)}`;
  fig.append(cap);
  return fig;
}

function strip(d, values, top) {
  return d.tokens.map((t, i) => `<span class="tok" data-score="${values[i].toPrecision(4)}" title="${
    values[i].toPrecision(3)}" style="background:rgba(214,39,40,${(values[i] / Math.max(top, 1e-30)).toFixed(3)})">${
    esc(t)}</span>`).join("");
}

function show(b, l, h) {
  const d = data(b), box = document.querySelector(`#ex${b}-detail .head-detail`);
  if (!d || !box || l >= d.layers || h >= d.heads) return false;
  const ov = overview(b);
  ov.querySelectorAll("a.cell.sel").forEach(c => c.classList.remove("sel"));
  ov.querySelector(`a.cell[data-layer="${l}"][data-head="${h}"]`).classList.add("sel");
  const hd = d.maps[l * d.heads + h];
  const value = key => { const m = d.measures.find(x => x.key === key); return m ? m.values[l][h] : null; };
  const stoch = value("stochastic_null_dim"), nd = value("null_dim");
  box.innerHTML = "";
  box.dataset.layer = l;
  box.dataset.head = h;
  const verdict = stoch === 0
    ? `<span class='ok'>${nd === 0 ? "identifiable" : "identifiable among distributions"}</span>`
    : `<span class='bad'>not identifiable</span>: a different map (TV ${fmt(value("alt_attention_tv"), false)}) `
      + "gives the same output";
  const title = el("h3");
  title.innerHTML = `Layer ${l}, head ${h}: ${verdict}`;
  box.append(title);
  const stats = d.measures.map(m => `${esc(m.label)} <b>${fmt(m.values[l][h], m.int)}</b>`).concat(
    Object.entries(hd.stats).map(([k, v]) => `${esc(d.stat_labels[k])} <b>${v === null ? "–" : v.toPrecision(2)}</b>`));
  box.append(Object.assign(el("p", {class: "stats"}), {innerHTML: stats.join(" · ")}));
  const grid = d.block > 1 ? `, averaged over ${d.block} x ${d.block}-token blocks (${d.side} x ${d.side} cells)` : "";
  box.append(el("p", {class: "hint"}, `Rows are queries, columns keys${grid}; each map on its own scale, `
    + (d.labelled ? "hover for values." : "hover for tokens and values.")));
  const maps = el("div", {class: "maps"});
  maps.append(drawMap(d, decode(b, l, h, "a"), hd.top, false, "raw", "raw A"));
  maps.append(drawMap(d, decode(b, l, h, "e"), hd.etop, true, "effective", "effective A_eff"));
  if (hd.w !== null) maps.append(drawMap(d, decode(b, l, h, "w"), hd.top, false, "witness", "witness A' (A'T = AT)"));
  box.append(maps);
  if (hd.w === null) {
    box.append(el("p", {class: "hint"}, "Identifiable head: no other attention map gives its output, so there is no "
      + "witness to draw."));
  }
  const rows = [["raw A", decode(b, l, h, "r0")]];
  if (hd.w0 !== null) rows.push(["witness A'", decode(b, l, h, "w0")]);
  box.append(el("p", {}, `Row of token 0 (${d.tokens[0]}), what the head reads into it (shaded by weight; `
    + "the explainers' strips follow):"));
  const table = el("table", {class: "rows"});
  table.innerHTML = rows.map(([name, v]) => `<tr data-row="${esc(name)}"><th class="l">${esc(name)}</th>`
    + `<td class="strip">${strip(d, v, hd.rtop)}</td></tr>`).join("");
  box.append(table);
  return true;
}

function route(scroll) {
  const m = /^#ex(\d+)-l(\d+)-h(\d+)$/.exec(location.hash);
  if (m && show(+m[1], +m[2], +m[3]) && scroll) {
    (document.getElementById(`ex${m[1]}`) || overview(+m[1])).scrollIntoView();
  }
}

document.querySelectorAll(".overview select.measure").forEach(s => {
  s.addEventListener("change", () => recolour(+s.dataset.example));
});
window.addEventListener("hashchange", () => route(false));
route(true);
window.identifiabilityReport = {show, decode, recolour};
})();
"""


@cache
def script() -> str:
    """The page's script, with the colour tables filled in."""
    table = {"__SEQ__": base64.b64encode(_lut("viridis").tobytes()).decode(),
             "__DIV__": base64.b64encode(_lut("RdBu_r").tobytes()).decode(),
             "__GSEQ__": legend_gradient("viridis"), "__GDIV__": legend_gradient("RdBu_r")}
    out = _JS
    for k, v in table.items():
        out = out.replace(k, v)
    return out
